"""The dev stack's EVM chain (``avcc dev --chain evm``): ganache, a funded signing key, the registry.

DEV ONLY: the signing key is generated into ``<datadir>/chain/signer.key`` and funded at
ganache's genesis; the chain persists in ``<datadir>/chain/ganache/db`` and the registry is
deployed once (its address is kept in ``<datadir>/chain/contract-address``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlparse

from app.platform.errors import ConfigurationError
from app.platform.settings import Settings
from app.servers.ganache import GanacheNode
from app.servers.process import LOOPBACK

__all__ = ["DEV_CHAIN_PORT", "DevChain", "dev_chain_port", "start_dev_chain"]

#: Loopback port of the dev chain's JSON-RPC endpoint.
DEV_CHAIN_PORT: Final = 18545


@dataclass
class DevChain:
    """A running dev chain and the ``AVCC_CHAIN_*`` environment that points workers at it."""

    node: GanacheNode
    env: dict[str, str]

    def stop(self) -> None:
        """Stop ganache (the chain is kept on disk)."""
        self.node.stop()


def dev_chain_port(settings: Settings) -> int:
    """Where the dev chain listens: the port of a loopback ``AVCC_CHAIN_URL``, else 18545."""
    if settings.chain_url.startswith("local:"):
        return DEV_CHAIN_PORT
    parsed = urlparse(settings.chain_url)
    if parsed.hostname not in {LOOPBACK, "localhost"} or parsed.port is None:
        raise ConfigurationError(
            f"avcc dev --chain evm runs its node on loopback; AVCC_CHAIN_URL={settings.chain_url!r} is not"
        )
    return parsed.port


def start_dev_chain(data_dir: Path, port: int = DEV_CHAIN_PORT) -> DevChain:
    """Start ganache on loopback, deploy AvccRegistry if needed, return the workers' environment."""
    from app.lifecycle.chain.deploy import contract_deployed, deploy_registry
    from app.lifecycle.chain.keys import create_key_file

    root = data_dir / "chain"
    key_file = root / "signer.key"
    key = create_key_file(key_file)
    node = GanacheNode(root / "ganache", port=port, funded_keys=[key], die_with_parent=True)
    node.start()
    try:
        address_file = root / "contract-address"
        address = address_file.read_text().strip() if address_file.exists() else ""
        if not address or not contract_deployed(node.url, address):
            address = deploy_registry(node.url, key)
            address_file.write_text(address + "\n")
    except BaseException:
        node.stop()
        raise
    env = {"AVCC_CHAIN_URL": node.url, "AVCC_CHAIN_CONTRACT": address, "AVCC_CHAIN_KEY_FILE": str(key_file)}
    return DevChain(node, env)
