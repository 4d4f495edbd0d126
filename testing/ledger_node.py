"""The ledger node (``avcc chain node``) as a subprocess: one chain shared by every chain replica."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from app.servers.process import LOOPBACK, ManagedServer
from testing.ports import free_port

__all__ = ["LedgerNode"]


class LedgerNode(ManagedServer):
    """``avcc chain node`` on loopback, its ledger in ``data_dir/ledger``; chain workers use
    :attr:`env` (``AVCC_CHAIN_URL`` and ``AVCC_CHAIN_NODE_TOKEN``)."""

    name = "ledger-node"

    def __init__(
        self,
        data_dir: Path,
        token: str,
        port: int | None = None,
        *,
        block_interval_ms: int = 100,
        ready_timeout: float = 30.0,
    ) -> None:
        super().__init__(data_dir, ready_timeout=ready_timeout, stop_timeout=10.0)
        self.token = token
        self.port = port if port is not None else free_port()
        self.block_interval_ms = block_interval_ms

    @property
    def ledger_path(self) -> Path:
        """The node's ledger directory (``avcc chain verify --path``)."""
        return self.data_dir / "ledger"

    @property
    def url(self) -> str:
        """Base URL of the node's HTTP API."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a chain worker needs to notarise on this node."""
        return {"AVCC_CHAIN_URL": f"ledger://{LOOPBACK}:{self.port}", "AVCC_CHAIN_NODE_TOKEN": self.token}

    def _command(self) -> list[str]:
        return [
            sys.executable, "-m", "app", "chain", "node",
            "--host", LOOPBACK, "--port", str(self.port), "--path", str(self.ledger_path),
        ]  # fmt: skip

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "AVCC_CHAIN_NODE_TOKEN": self.token,
            "AVCC_BLOCK_INTERVAL_MS": str(self.block_interval_ms),
        }

    def _probe(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1.0) as response:
                return bool(response.status == 200)
        except OSError:
            return False
