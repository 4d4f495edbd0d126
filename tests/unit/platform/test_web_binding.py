"""Where a worker listens (AVCC_WEB_HOST) vs what it announces to its peers (advertised URL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.platform.errors import ConfigurationError
from app.platform.faust.app import create_app
from app.platform.settings import Settings, get_settings


def test_the_default_listens_on_loopback_and_announces_it() -> None:
    settings = Settings()
    assert settings.web_host == "127.0.0.1"
    assert settings.advertised_url(6067) == "http://127.0.0.1:6067"


def test_a_wildcard_bind_must_announce_a_reachable_address() -> None:
    with pytest.raises(ConfigurationError, match="AVCC_WEB_ADVERTISED_URL"):
        Settings(web_host="0.0.0.0").advertised_url(6067)
    pod = Settings(web_host="0.0.0.0", web_advertised_url="http://10.1.2.3:{port}")
    assert pod.advertised_url(6067) == "http://10.1.2.3:6067"


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::"])
def test_dev_mode_refuses_a_public_bind_unless_told(host: str) -> None:
    with pytest.raises(ConfigurationError, match="AVCC_DEV_ALLOW_PUBLIC_BIND"):
        Settings(dev_mode=True, web_host=host).check_bind()
    Settings(dev_mode=True, web_host=host, dev_allow_public_bind=True).check_bind()
    Settings(dev_mode=False, web_host=host).check_bind()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_dev_mode_accepts_loopback(host: str) -> None:
    Settings(dev_mode=True, web_host=host).check_bind()


def test_the_app_binds_web_host_announces_its_url_and_serves_no_faust_table_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AVCC_WEB_HOST", "127.0.0.3")
    monkeypatch.setenv("AVCC_WEB_ADVERTISED_URL", "http://replica-3.example:{port}")
    get_settings.cache_clear()
    app = create_app("avcc-test-binding", datadir=tmp_path, web_port=7001)
    assert app.conf.web_bind == "127.0.0.3"
    assert str(app.conf.canonical_url) == "http://replica-3.example:7001"
    assert app.conf.web_host == "replica-3.example"
    assert app.conf.web_tables_enabled is False
    assert app.conf.web_router_enabled is False


@pytest.mark.parametrize("url", ["http://u:topsecret@h:1", "kafka://u:topsecret@h:9092", "x://u:topsecret@["])
def test_a_bad_kafka_url_is_refused_without_echoing_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        _ = Settings(kafka_url=url).kafka_bootstrap
    assert "topsecret" not in str(info.value)
