"""Unit tests run without any broker: they must not reach one, even by accident."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.platform.settings import get_settings


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point the settings at a closed loopback port, so a unit test that would need an answer from
    a broker fails instead of finding one that an integration test or ``make run`` left on the
    default port; signed requests' nonces are kept in the process.
    """
    monkeypatch.setenv("AVCC_KAFKA_URL", "kafka://127.0.0.1:1")
    monkeypatch.setenv("AVCC_NONCE_STORE", "local")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
