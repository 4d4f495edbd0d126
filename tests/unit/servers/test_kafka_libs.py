"""The Kafka jar fetcher against a Maven-layout server on loopback (files from ``tmp_path``): a
verified set is installed whole and cached; a jar whose bytes differ from its pin is refused by
name and nothing is installed."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.servers.kafka_jars import KAFKA_RUNTIME_JARS, MavenJar
from app.servers.kafka_libs import JarChecksumMismatch, ensure_kafka_libs, kafka_libs_ready
from app.servers.process import ServerNotInstalled


class _Repository:
    """A Maven 2 layout served over HTTP on 127.0.0.1, counting the jars it serves."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.served: list[str] = []
        repository = self

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                repository.served.append(self.path)
                super().do_GET()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/maven2"

    def publish(self, group: str, artifact: str, version: str, content: bytes) -> MavenJar:
        """Put a jar into the layout; return it pinned to ``content``'s digest."""
        jar = MavenJar(group, artifact, version, hashlib.sha256(content).hexdigest())
        path = self.root / "maven2" / jar.url("").lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return jar


@pytest.fixture
def repository(tmp_path: Path) -> Iterator[_Repository]:
    repo = _Repository(tmp_path / "repo")
    repo.thread.start()
    yield repo
    repo.server.shutdown()
    repo.server.server_close()


def test_the_verified_jars_are_installed_whole_and_then_served_from_the_cache(
    repository: _Repository, tmp_path: Path
) -> None:
    jars = (
        repository.publish("org.example", "broker", "1.0", b"broker classes"),
        repository.publish("org.example.deep", "client", "2.0", b"client classes"),
    )
    libs = tmp_path / "cache" / "kafka"
    assert ensure_kafka_libs(libs, jars=jars, repository=repository.url) == libs.resolve()
    assert (libs / "broker-1.0.jar").read_bytes() == b"broker classes"
    assert (libs / "client-2.0.jar").read_bytes() == b"client classes"
    assert sorted(repository.served) == [
        "/maven2/org/example/broker/1.0/broker-1.0.jar",
        "/maven2/org/example/deep/client/2.0/client-2.0.jar",
    ]
    assert kafka_libs_ready(libs, jars)
    ensure_kafka_libs(libs, jars=jars, repository=repository.url)
    assert len(repository.served) == 2, "a complete, verified set is not downloaded again"
    assert [p.name for p in libs.parent.iterdir() if p.name.startswith(".kafka.tmp")] == []

    repinned = (jars[0], repository.publish("org.example.deep", "client", "2.1", b"newer client"))
    assert not kafka_libs_ready(libs, repinned), "a changed table makes the cached set stale"
    ensure_kafka_libs(libs, jars=repinned, repository=repository.url)
    assert sorted(p.name for p in libs.glob("*.jar")) == ["broker-1.0.jar", "client-2.1.jar"]


def test_a_corrupted_jar_is_refused_by_name_and_nothing_is_installed(
    repository: _Repository, tmp_path: Path
) -> None:
    good = repository.publish("org.example", "broker", "1.0", b"broker classes")
    pinned = repository.publish("org.example", "client", "2.0", b"client classes")
    corrupted = repository.root / "maven2" / pinned.url("").lstrip("/")
    corrupted.write_bytes(b"client classes, tampered")
    libs = tmp_path / "cache" / "kafka"
    with pytest.raises(JarChecksumMismatch) as refused:
        ensure_kafka_libs(libs, jars=(good, pinned), repository=repository.url)
    message = str(refused.value)
    assert "client-2.0.jar (org.example:client:2.0)" in message
    assert f"expected {pinned.sha256}" in message
    assert hashlib.sha256(b"client classes, tampered").hexdigest() in message
    assert not libs.exists(), "no partial set is ever installed"
    assert [p.name for p in libs.parent.iterdir() if not p.name.endswith(".lock")] == []


def test_the_pinned_table_is_kafkas_whole_runtime_classpath() -> None:
    names = [jar.filename for jar in KAFKA_RUNTIME_JARS]
    assert len(names) == len(set(names)) == 57
    assert {"kafka_2.13-3.9.1.jar", "kafka-clients-3.9.1.jar", "slf4j-reload4j-1.7.36.jar"} <= set(names)
    assert all(len(jar.sha256) == 64 and int(jar.sha256, 16) >= 0 for jar in KAFKA_RUNTIME_JARS)
    assert KAFKA_RUNTIME_JARS[0].url("https://repo.example/maven2/") == (
        "https://repo.example/maven2/net/sourceforge/argparse4j/argparse4j/0.7.0/argparse4j-0.7.0.jar"
    )


def test_a_directory_that_is_not_a_jar_cache_is_never_replaced(
    repository: _Repository, tmp_path: Path
) -> None:
    jars = (repository.publish("org.example", "broker", "1.0", b"broker classes"),)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "README.md").write_text("precious")
    with pytest.raises(ServerNotInstalled, match="is not a Kafka jar cache"):
        ensure_kafka_libs(checkout, jars=jars, repository=repository.url)
    assert (checkout / "README.md").read_text() == "precious"
