"""Kafka's jars, fetched from a Maven repository by pinned coordinates and checked by SHA-256.

No Maven needed: :func:`ensure_kafka_libs` downloads every jar of
:data:`~app.servers.kafka_jars.KAFKA_RUNTIME_JARS` in parallel with ``urllib``, verifies each
file's digest, and moves the complete set into place with one rename, so a reader never sees a
partial set and an interrupted download is simply done again on the next call. A file lock
serialises concurrent callers (two test sessions, ``avcc dev`` and a bench). A jar whose bytes do
not match its pinned digest is refused by name (:class:`JarChecksumMismatch`).

The set is cached between runs in ``$AVCC_KAFKA_LIBS_DIR``, by default
``${XDG_CACHE_HOME:-~/.cache}/avcc/kafka-3.9.1``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from app.servers.kafka_jars import KAFKA_RUNTIME_JARS, KAFKA_VERSION, MavenJar
from app.servers.process import ServerNotInstalled
from app.servers.settings import EmbeddedKafkaSettings, get_embedded_kafka_settings

__all__ = [
    "JarChecksumMismatch",
    "default_libs_dir",
    "ensure_kafka_libs",
    "kafka_libs_ready",
]

#: Marks a complete, verified set: the digest of the jar table it was made from.
_STAMP = ".avcc-jars.sha256"
_DOWNLOADERS = 8
_CHUNK = 1 << 16


class JarChecksumMismatch(ServerNotInstalled):
    """A downloaded jar's bytes differ from its pinned SHA-256: a corrupted download, a tampered
    mirror or a wrong pin. Nothing was installed; check ``AVCC_KAFKA_MAVEN_URL`` and try again."""


def _table_digest(jars: Iterable[MavenJar]) -> str:
    """One digest of the whole table: a changed pin makes the cached set stale."""
    lines = "".join(f"{j.group}:{j.artifact}:{j.version} {j.sha256}\n" for j in jars)
    return hashlib.sha256(lines.encode()).hexdigest()


def default_libs_dir(settings: EmbeddedKafkaSettings | None = None) -> Path:
    """Where the jars are cached: ``AVCC_KAFKA_LIBS_DIR``, else the user's cache dir."""
    settings = settings if settings is not None else get_embedded_kafka_settings()
    if settings.libs_dir is not None:
        return settings.libs_dir.expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser().resolve() / "avcc" / f"kafka-{KAFKA_VERSION}"


def kafka_libs_ready(libs: Path, jars: tuple[MavenJar, ...] = KAFKA_RUNTIME_JARS) -> bool:
    """True when ``libs`` holds a complete set verified against this very table."""
    try:
        return (libs / _STAMP).read_text().strip() == _table_digest(jars) and all(
            (libs / jar.filename).is_file() for jar in jars
        )
    except OSError:
        return False


def _download(jar: MavenJar, repository: str, target: Path, timeout: float) -> None:
    """Fetch one jar into ``target``, hashing as it streams; refuse it on a digest mismatch."""
    url = jar.url(repository)
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, target.open("wb") as out:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:
        raise ServerNotInstalled(f"kafka: cannot download {jar.filename} from {url}: {exc}") from exc
    if digest.hexdigest() != jar.sha256:
        target.unlink(missing_ok=True)
        raise JarChecksumMismatch(
            f"kafka: {jar.filename} ({jar.group}:{jar.artifact}:{jar.version}) from {url} has SHA-256 "
            f"{digest.hexdigest()}, expected {jar.sha256}; refused"
        )


def _remove_old_set(libs: Path) -> None:
    """Remove a stale or partial jar set, refusing a directory that holds anything else (a
    mistyped ``AVCC_KAFKA_LIBS_DIR`` must never cost anybody their files)."""
    if not libs.exists():
        return
    strangers = [p.name for p in libs.iterdir() if p.name != _STAMP and not p.name.endswith(".jar")]
    if strangers or not libs.is_dir():
        raise ServerNotInstalled(
            f"kafka: {libs} is not a Kafka jar cache (it holds {', '.join(sorted(strangers)[:5])}); "
            "point AVCC_KAFKA_LIBS_DIR at a directory of its own"
        )
    shutil.rmtree(libs)


def _download_all(jars: tuple[MavenJar, ...], repository: str, into: Path, timeout: float) -> None:
    """Fetch ``jars`` in parallel; the first failure cancels what has not started and is raised."""
    pool = ThreadPoolExecutor(_DOWNLOADERS, thread_name_prefix="kafka-jar")
    try:
        futures = [pool.submit(_download, jar, repository, into / jar.filename, timeout) for jar in jars]
        for future in futures:
            future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def ensure_kafka_libs(
    libs: Path | None = None,
    *,
    jars: tuple[MavenJar, ...] = KAFKA_RUNTIME_JARS,
    repository: str | None = None,
    timeout: float = 60.0,
) -> Path:
    """Return the directory holding every jar of ``jars``, downloading and verifying them first
    when the cached set is missing, incomplete or made from another table.

    ``libs`` defaults to :func:`default_libs_dir`, ``repository`` to ``AVCC_KAFKA_MAVEN_URL``.
    """
    settings = get_embedded_kafka_settings()
    libs = Path(libs).resolve() if libs is not None else default_libs_dir(settings)
    if kafka_libs_ready(libs, jars):
        return libs
    repository = repository or settings.maven_url
    libs.parent.mkdir(parents=True, exist_ok=True)
    with (libs.parent / f".{libs.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if kafka_libs_ready(libs, jars):  # another caller finished while we waited
            return libs
        staging = libs.parent / f".{libs.name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            _download_all(jars, repository, staging, timeout)
            (staging / _STAMP).write_text(_table_digest(jars) + "\n")
            _remove_old_set(libs)
            staging.rename(libs)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return libs
