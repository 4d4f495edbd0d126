"""The dev stack's EVM chain (``avcc dev --chain evm``): ganache, a funded signing key, the registry.

DEV ONLY: the signing key is generated into ``<datadir>/chain/signer.key`` and funded at
ganache's genesis; the chain persists in ``<datadir>/chain/ganache/db`` and the registry is
deployed once (its address is kept in ``<datadir>/chain/contract-address``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from app.servers.ganache import GanacheNode

__all__ = ["DEV_CHAIN_PORT", "DevChain", "start_dev_chain"]

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


def start_dev_chain(data_dir: Path, port: int = DEV_CHAIN_PORT) -> DevChain:
    """Start ganache on loopback, deploy AvccRegistry if needed, return the workers' environment."""
    from app.lifecycle.chain.deploy import contract_deployed, deploy_registry
    from app.lifecycle.chain.keys import create_key_file

    root = data_dir / "chain"
    key_file = root / "signer.key"
    key = create_key_file(key_file)
    node = GanacheNode(root / "ganache", port=port, funded_keys=[key])
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
