"""Chooses the chain group's backend from ``AVCC_CHAIN_URL``: local ledger, ledger node or EVM node."""

from __future__ import annotations

from urllib.parse import urlparse

from app.lifecycle.chain.ledger import ChainBackend, LocalLedger
from app.platform.errors import ConfigurationError
from app.platform.settings import Settings

__all__ = ["backend_kind", "open_backend"]


def backend_kind(settings: Settings) -> str:
    """``"local"``, ``"node"`` or ``"evm"`` (``ConfigurationError`` for any other URL scheme)."""
    scheme = urlparse(settings.chain_url).scheme
    if scheme == "local":
        return "local"
    if scheme == "ledger":
        return "node"
    if scheme in {"http", "https"}:
        return "evm"
    raise ConfigurationError(
        "AVCC_CHAIN_URL must be local://, ledger://host:port or http(s)://host:port, "
        f"got {settings.chain_url!r}"
    )


def open_backend(settings: Settings) -> ChainBackend:
    """The configured backend; web3 is imported only for the EVM one (it is slow to import)."""
    kind = backend_kind(settings)
    if kind == "local":
        return LocalLedger(settings.resolve_data_path("ledger"), settings.block_interval_ms)
    if kind == "node":
        from app.lifecycle.chain.remote import RemoteLedger

        token = settings.chain_node_token.get_secret_value() if settings.chain_node_token else ""
        return RemoteLedger("http://" + urlparse(settings.chain_url).netloc, token)
    from app.lifecycle.chain.evm import EvmBackend

    return EvmBackend.from_settings(settings)
