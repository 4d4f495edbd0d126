"""Chooses the chain group's backend from ``AVCC_CHAIN_URL``: the local ledger or an EVM node."""

from __future__ import annotations

from urllib.parse import urlparse

from app.lifecycle.chain.ledger import ChainBackend, LocalLedger
from app.platform.errors import ConfigurationError
from app.platform.settings import Settings

__all__ = ["backend_kind", "open_backend"]


def backend_kind(settings: Settings) -> str:
    """``"local"`` or ``"evm"`` (``ConfigurationError`` for any other URL scheme)."""
    scheme = urlparse(settings.chain_url).scheme
    if scheme == "local":
        return "local"
    if scheme in {"http", "https"}:
        return "evm"
    raise ConfigurationError(
        f"AVCC_CHAIN_URL must be local:// or http(s)://host:port, got {settings.chain_url!r}"
    )


def open_backend(settings: Settings) -> ChainBackend:
    """The configured backend; web3 is imported only for the EVM one (it is slow to import)."""
    if backend_kind(settings) == "local":
        return LocalLedger(settings.resolve_data_path("ledger"), settings.block_interval_ms)
    from app.lifecycle.chain.evm import EvmBackend

    return EvmBackend.from_settings(settings)
