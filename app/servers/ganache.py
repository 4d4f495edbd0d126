"""Ganache, a local Ethereum JSON-RPC node from npm (``deploy/chain/node_modules``), as a subprocess.

The dev stack (``avcc dev --chain evm``) and the chain integration tests run it on loopback with
a persistent database, so a stop/start keeps every block, and with the chain-svc signing key
funded from genesis. ``scripts/install-deps.sh`` installs it (``npm ci`` in ``deploy/chain``).
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from app.servers.process import LOOPBACK, ManagedServer, ServerNotInstalled

__all__ = ["CHAIN_TOOLS_DIR", "DEV_CHAIN_ID", "GanacheNode", "find_node", "rpc_call"]

#: Where ``deploy/chain/package.json`` installs ganache and solc.
CHAIN_TOOLS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "chain"
DEV_CHAIN_ID = 1337
#: Genesis balance of every funded account (1000 ether, in wei).
_BALANCE_WEI = 10**21


def find_node() -> str:
    """Path of the ``node`` executable (``ServerNotInstalled`` when Node.js is missing)."""
    node = shutil.which("node")
    if node is None:
        raise ServerNotInstalled("node: Node.js is not on PATH (scripts/install-deps.sh needs node 20)")
    return node


def rpc_call(url: str, method: str, params: Sequence[object] = (), timeout: float = 2.0) -> object:
    """One JSON-RPC request to ``url``; the ``result`` (``RuntimeError`` on an error answer)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read())
    if "error" in answer:
        raise RuntimeError(f"{method}: {answer['error']}")
    return answer["result"]


class GanacheNode(ManagedServer):
    """A ganache 7 node on ``127.0.0.1`` mining each transaction at once (instamine).

    ``instamine="eager"`` answers ``eth_sendRawTransaction`` once the block is mined, ``"strict"``
    at once (so ``miner_stop`` can hold transactions pending, like a congested chain). A
    ``block_time_s`` above 0 mines a block every that many seconds instead, like a real chain.
    ``funded_keys`` (hex private keys) get 1000 ether at genesis. The chain lives in
    ``data_dir/db`` and survives restarts; its log goes to ``data_dir/ganache.log``.
    """

    name = "ganache"

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int,
        funded_keys: Sequence[str] = (),
        chain_id: int = DEV_CHAIN_ID,
        instamine: str = "eager",
        block_time_s: float = 0.0,
        tools_dir: Path = CHAIN_TOOLS_DIR,
        ready_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        die_with_parent: bool = False,
    ) -> None:
        super().__init__(
            data_dir, ready_timeout=ready_timeout, stop_timeout=stop_timeout, die_with_parent=die_with_parent
        )
        self.port = port
        self.funded_keys = list(funded_keys)
        self.chain_id = chain_id
        self.instamine = instamine
        self.block_time_s = block_time_s
        self.tools_dir = tools_dir

    @property
    def url(self) -> str:
        """The JSON-RPC endpoint: ``http://127.0.0.1:PORT``."""
        return f"http://{LOOPBACK}:{self.port}"

    def _prepare(self) -> None:
        (self.data_dir / "db").mkdir(parents=True, exist_ok=True)

    def _command(self) -> list[str]:
        cli = self.tools_dir / "node_modules" / "ganache" / "dist" / "node" / "cli.js"
        if not cli.is_file():
            raise ServerNotInstalled(f"ganache: {cli} is missing; run `npm ci` in {self.tools_dir}")
        argv = [
            find_node(),
            str(cli),
            "--server.host",
            LOOPBACK,
            "--server.port",
            str(self.port),
            "--chain.chainId",
            str(self.chain_id),
            "--database.dbPath",
            str(self.data_dir / "db"),
            "--miner.instamine",
            self.instamine,
            "--miner.blockTime",
            f"{self.block_time_s:g}",
            "--logging.quiet",
        ]
        for key in self.funded_keys:
            argv += ["--wallet.accounts", f"0x{key.removeprefix('0x')},{_BALANCE_WEI}"]
        return argv

    def _probe(self) -> bool:
        return isinstance(rpc_call(self.url, "eth_blockNumber"), str)
