"""EVM chain backend: notarisation through the AvccRegistry contract over Ethereum JSON-RPC.

Works with any node speaking the Ethereum JSON-RPC and running EVM contracts (FISCO BCOS,
ChainMaker, Ethereum-compatible consortium chains, ganache in dev). :meth:`EvmBackend.submit`
is idempotent and crash-safe:

1. a key with a confirmed receipt in the journal is answered from it;
2. the contract is asked whether the record (settlement key) is registered already; if so the
   registering transaction is read from the contract's event in the registration's block;
3. else a transaction the journal holds for the key (sent by this or a dead worker) is polled:
   receipts of every signed version, until it is mined or its nonce went to another one;
4. else a new transaction is signed (nonces handed out under a lock, past every journaled one:
   :func:`~app.lifecycle.chain.nonces.next_nonce`), journaled, then sent;
5. once mined with status 1 - or reverted because the record is already registered, which is
   success - it waits for ``confirmations`` blocks and answers with the real tx hash, block
   number and the contract address as ``crd_address``.

While anything is in flight, a nonce keeper task (:meth:`EvmBackend.keep_nonces`) keeps the
key's nonce sequence moving: it rebroadcasts journaled transactions the node forgot (a node
restart empties its pool), fills nonces nothing will ever be sent with (a refused transaction)
with a no-op transfer, and replaces the transaction next in line with a higher gas price when it
is not mined within ``tx_timeout_s`` (with it, the overdue ones right behind it). Keys whose
events wait in the retry topic meanwhile do not hold up the others.

The contract refuses a second registration of a record id or content hash itself, so no path
can register a work twice. Failures are retriable: node unreachable -> ``DependencyUnavailable``,
nonce too low / out of gas / reverted -> ``ChainTransactionFailed``, confirmations late ->
``DependencyTimeout``; a content hash registered to another record -> ``BusinessRuleViolation``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import aiohttp
from eth_account import Account
from eth_typing import ChecksumAddress, HexStr
from eth_utils.crypto import keccak
from web3 import AsyncWeb3
from web3.exceptions import (
    ContractLogicError,
    ProviderConnectionError,
    TransactionNotFound,
    Web3RPCError,
)

from app.lifecycle.chain.blocks import PendingTx, Receipt
from app.lifecycle.chain.evm_logs import block_logs
from app.lifecycle.chain.journal import SentTx, TxJournal
from app.lifecycle.chain.nonces import next_nonce, plan_repair
from app.lifecycle.chain.registry import RegistryCall, load_artefact, registry_call
from app.platform.errors import (
    BusinessRuleViolation,
    ChainTransactionFailed,
    DependencyTimeout,
    DependencyUnavailable,
)
from app.platform.settings import Settings

__all__ = ["NODE_ERRORS", "EvmBackend", "custom_error_names"]

log = logging.getLogger(__name__)

#: What a JSON-RPC call raises when the node cannot be reached.
NODE_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientError,
    OSError,
    TimeoutError,
    ProviderConnectionError,
)
#: Custom errors of AvccRegistry meaning "this registration exists already".
_ALREADY = frozenset({"RecordAlreadyRegistered", "SettlementAlreadyRecorded"})
#: Gas limit head room over the estimate, and gas price increase of a replacement.
_GAS_HEADROOM = 1.25
_REPLACEMENT_BUMP = 1.25
#: Gas price over the latest base fee: room for six full blocks in a row before a transaction is
#: priced out (1.125 ** 6 ~ 2).
_BASE_FEE_HEADROOM = 2
#: Gas of a plain transfer: the no-op that fills a nonce gap.
_TRANSFER_GAS = 21_000
#: A transaction polled this many ``tx_timeout_s`` (plus ``_POLL_GRACE_S``) without being mined
#: gives its event back to the retry path (the journal keeps it, so the retry resumes polling it).
_POLL_TIMEOUTS = 3
_POLL_GRACE_S = 30.0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def custom_error_names(abi: list[dict[str, Any]]) -> dict[str, str]:
    """``0x`` + 4-byte selector -> name of every custom error in ``abi``."""
    names: dict[str, str] = {}
    for entry in abi:
        if entry.get("type") == "error":
            types = ",".join(i["type"] for i in entry.get("inputs", []))
            names["0x" + keccak(text=f"{entry['name']}({types})")[:4].hex()] = entry["name"]
    return names


class EvmBackend:
    """The ``ChainBackend`` on an EVM node; one signing key per worker (nonces are handed out here)."""

    def __init__(
        self,
        url: str,
        contract: str,
        private_key: str,
        journal: TxJournal,
        *,
        confirmations: int = 1,
        tx_timeout_s: float = 60.0,
        poll_s: float = 0.1,
        request_timeout_s: float = 10.0,
    ) -> None:
        self.url = url
        self.confirmations = confirmations
        self.tx_timeout_s = tx_timeout_s
        self.poll_s = poll_s
        self._w3 = AsyncWeb3(AsyncWeb3.AsyncHTTPProvider(url, request_kwargs={"timeout": request_timeout_s}))
        self.address = AsyncWeb3.to_checksum_address(contract)
        artefact = load_artefact()
        self._contract = self._w3.eth.contract(address=self.address, abi=artefact.abi)
        self._errors = custom_error_names(artefact.abi)
        self._account = Account.from_key(private_key)
        self._journal = journal
        self._nonce_lock = asyncio.Lock()
        self._next_nonce: int | None = None
        self._chain_id: int | None = None
        self._key_locks: dict[str, asyncio.Lock] = {}
        self._head_lock = asyncio.Lock()
        self._head = -1
        self._keeper: asyncio.Task[None] | None = None
        self.keeper_interval_s = min(2.0, tx_timeout_s / 4)

    @classmethod
    def from_settings(cls, settings: Settings) -> EvmBackend:
        """The backend ``AVCC_CHAIN_*`` configures (journal under the data dir)."""
        from app.lifecycle.chain.deploy import require_contract
        from app.lifecycle.chain.keys import read_key

        return cls(
            settings.chain_url,
            require_contract(settings),
            read_key(settings),
            TxJournal(settings.resolve_data_path("chain-journal")),
            confirmations=settings.chain_confirmations,
            tx_timeout_s=settings.chain_tx_timeout_s,
        )

    @property
    def sender(self) -> ChecksumAddress:
        """Address of the signing key."""
        return ChecksumAddress(self._account.address)

    def in_flight(self, idempotency_key: str) -> SentTx | None:
        """The signed versions of a key's transaction not confirmed yet, or ``None``."""
        return self._journal.sent(idempotency_key)

    def receipt(self, idempotency_key: str) -> Receipt | None:
        """The confirmed receipt of ``idempotency_key`` this backend recorded, or ``None``."""
        return self._journal.confirmed(idempotency_key)

    async def submit(self, tx: PendingTx) -> Receipt:
        """Register ``tx`` on chain once and return its confirmed receipt (see the module doc)."""
        done = self._journal.confirmed(tx.idempotency_key)
        if done is not None:
            return done
        call = registry_call(tx)
        self._start_keeper()
        lock = self._key_locks.setdefault(tx.idempotency_key, asyncio.Lock())
        try:
            async with lock:
                return await self._submit(tx, call)
        except NODE_ERRORS as exc:
            self._next_nonce = None
            raise DependencyUnavailable(f"chain node {self.url} unreachable: {exc!r}") from exc
        finally:
            if not lock.locked():
                self._key_locks.pop(tx.idempotency_key, None)

    def close(self) -> None:
        """Close the journal."""
        self._journal.close()

    async def aclose(self) -> None:
        """Stop the nonce keeper, close the HTTP session and the journal."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        await self._w3.provider.disconnect()
        self.close()

    # -- steps -----------------------------------------------------------------------

    async def _submit(self, tx: PendingTx, call: RegistryCall) -> Receipt:
        key = tx.idempotency_key
        found = await self.registered(call)
        if found is None:
            sent = self._journal.sent(key)
            if sent is None:
                await self._check_content(tx, call)
                sent = await self._send_new(key, call)
            mined = await self._await_mined(key, sent) if sent is not None else None
            if mined is not None and mined["status"] == 1:
                found = (mined["transactionHash"].to_0x_hex(), int(mined["blockNumber"]))
            else:
                found = await self.registered(call)  # reverted because already registered = success
                if found is None:
                    raise self._not_mined(key, mined)
        tx_hash, height = found
        await self._await_confirmations(height)
        receipt = Receipt(key, tx.chain_type, tx.avcc_record_id, tx_hash, height, "success", self.address)
        self._journal.record_confirmed(receipt)
        return receipt

    async def registered(self, call: RegistryCall) -> tuple[str, int] | None:
        """``(tx_hash, block_number)`` of the registration ``call`` asks for, or ``None``."""
        values = await getattr(self._contract.functions, call.view)(call.view_key).call()
        block = int(values[-1])
        if block == 0:
            return None
        logs = await block_logs(self._w3, block, self.address, call.topics)
        if not logs:
            raise ChainTransactionFailed(f"{call.view}({call.view_key!r}): block {block} has no event")
        return logs[0]["transactionHash"].to_0x_hex(), block

    async def _check_content(self, tx: PendingTx, call: RegistryCall) -> None:
        if call.content_hash is None:
            return
        holder = int(await self._contract.functions.recordOf(call.content_hash).call())
        if holder not in (0, tx.avcc_record_id):
            raise BusinessRuleViolation(
                f"content hash of record {tx.avcc_record_id} is registered on chain to record {holder}"
            )

    async def _estimate(self, call: RegistryCall) -> int:
        """Gas limit for ``call`` (estimate plus head room); a revert shows here, before sending.

        Runs outside the nonce lock: some nodes answer estimates only with the next block.
        """
        function = getattr(self._contract.functions, call.function)(*call.args)
        try:
            return int(await function.estimate_gas({"from": self.sender}) * _GAS_HEADROOM)
        except ContractLogicError as exc:
            raise self._reverted(exc) from exc

    async def gas_price(self) -> int:
        """The gas price to sign with: the node's, and on a chain with an EIP-1559 base fee at
        least :data:`_BASE_FEE_HEADROOM` times the latest block's base fee.

        A legacy transaction is mined only while its gas price covers the base fee, which grows
        up to 12.5 % per full block: a burst of registrations fills blocks, and transactions
        priced at the node's suggestion would wait in the pool until a replacement. Chains
        without a base fee (most consortium chains) use the node's price as it is.
        """
        price = int(await self._w3.eth.gas_price)
        block = await self._w3.eth.get_block("latest")
        base_fee = block.get("baseFeePerGas")
        return price if base_fee is None else max(price, _BASE_FEE_HEADROOM * int(base_fee))

    async def _sign(self, to: str, data: str, nonce: int, gas_price: int, gas: int) -> SentTx:
        """A legacy transaction to ``to`` with call ``data``, signed (not sent, not journaled)."""
        if self._chain_id is None:
            self._chain_id = await self._w3.eth.chain_id
        fields = {
            "to": to,
            "data": data,
            "value": 0,
            "nonce": nonce,
            "gas": gas,
            "gasPrice": gas_price,
            "chainId": self._chain_id,
        }
        signed = self._account.sign_transaction(fields)
        raw = signed.raw_transaction.to_0x_hex()
        return SentTx(nonce, gas_price, gas, raw, [signed.hash.to_0x_hex()], _now_ms(), to, data)

    async def _signed(self, call: RegistryCall, nonce: int, gas_price: int, gas: int) -> SentTx:
        """``call`` signed with ``nonce``, ``gas_price`` and limit ``gas``."""
        data = self._contract.encode_abi(call.function, args=list(call.args))
        return await self._sign(self.address, data, nonce, gas_price, gas)

    async def _send_new(self, key: str, call: RegistryCall) -> SentTx | None:
        """Sign, journal and send a new transaction; ``None`` if the contract says it is registered."""
        try:
            gas = await self._estimate(call)
        except ChainTransactionFailed as exc:
            if str(exc).split(":", 1)[0] in _ALREADY:
                return None
            raise
        async with self._nonce_lock:
            if self._next_nonce is None:
                pending = await self._w3.eth.get_transaction_count(self.sender, "pending")
                self._next_nonce = next_nonce(pending, (s.nonce for s in self._journal.in_flight().values()))
            nonce = self._next_nonce
            sent = await self._signed(call, nonce, await self.gas_price(), gas)
            self._journal.record_sent(key, sent)
            try:
                await self._w3.eth.send_raw_transaction(HexStr(sent.raw))
            except Web3RPCError as exc:
                self._next_nonce = None
                self._journal.forget_sent(key)
                raise ChainTransactionFailed(f"node refused transaction: {exc}") from exc
            except BaseException:
                self._next_nonce = None  # the node may or may not have it: resync
                raise
            self._next_nonce = nonce + 1
            log.debug("sent %s for %s (nonce %d)", sent.hashes[0], key, nonce)
            return sent

    async def _await_mined(self, key: str, sent: SentTx) -> Any:
        """The receipt of any version of ``sent``; ``None`` if its nonce went to another transaction.

        Rebroadcasts and replacements are the nonce keeper's; this re-reads the journal each
        block so it also polls the versions the keeper signed.
        """
        head = -1
        give_up = time.monotonic() + _POLL_TIMEOUTS * self.tx_timeout_s + _POLL_GRACE_S
        while True:
            taken = await self._w3.eth.get_transaction_count(self.sender, "latest") > sent.nonce
            for tx_hash in sent.hashes:
                try:
                    return await self._w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
                except TransactionNotFound:
                    continue
            if taken:
                self._journal.forget_sent(key)
                return None
            if time.monotonic() > give_up:
                raise DependencyTimeout(f"{key}: {sent.hashes[-1]} (nonce {sent.nonce}) not mined yet")
            head = await self._head_after(head, time.monotonic() + self.tx_timeout_s)
            sent = self._journal.sent(key) or sent

    # -- the nonce keeper --------------------------------------------------------------

    def _start_keeper(self) -> None:
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self.keep_nonces(), name="evm-nonce-keeper")

    async def keep_nonces(self) -> None:
        """Run :meth:`repair_nonces` every ``keeper_interval_s`` (node outages are waited out)."""
        while True:
            try:
                await self.repair_nonces()
            except NODE_ERRORS as exc:
                log.debug("nonce keeper: node unreachable: %r", exc)
            except Exception:
                log.exception("nonce keeper pass failed")
            await asyncio.sleep(self.keeper_interval_s)

    async def repair_nonces(self) -> None:
        """One pass: fill nonce gaps, rebroadcast what the node forgot, replace the overdue
        transactions from the one next in line (:func:`~app.lifecycle.chain.nonces.plan_repair`)."""
        async with self._nonce_lock:
            in_flight = self._journal.in_flight()
            if not in_flight:
                return
            mined = await self._w3.eth.get_transaction_count(self.sender, "latest")
            plan = plan_repair(mined, in_flight, _now_ms(), int(self.tx_timeout_s * 1000))
            for nonce in plan.fill:
                await self._fill(nonce)
            for key, sent in plan.waiting:
                if not await self._known(sent):
                    log.info("rebroadcasting %s for %s: the node does not know it", sent.hashes[-1], key)
                    if not await self._broadcast(sent.raw):
                        # priced under today's base fee (journaled before a restart, or before a
                        # burst raised it): waiting for the replacement timeout would stall the
                        # key and every nonce behind it
                        log.info("the node refused %s for %s: re-signing it now", sent.hashes[-1], key)
                        await self._replace(key, sent)
            for key, sent in plan.overdue:
                log.info("replacing %s for %s: not mined in %.0fs", sent.hashes[-1], key, self.tx_timeout_s)
                await self._replace(key, sent)

    async def _fill(self, nonce: int) -> None:
        """Send a no-op transfer to ourselves with ``nonce`` (no transaction of ours holds it)."""
        filler = await self._sign(self.sender, "0x", nonce, await self.gas_price(), _TRANSFER_GAS)
        log.warning("filling nonce gap %d with a no-op transfer %s", nonce, filler.hashes[0])
        await self._broadcast(filler.raw)

    async def _known(self, sent: SentTx) -> bool:
        for tx_hash in sent.hashes:
            try:
                await self._w3.eth.get_transaction(tx_hash)  # type: ignore[arg-type]
                return True
            except TransactionNotFound:
                continue
        return False

    async def _broadcast(self, raw: str) -> bool:
        """Send ``raw``; ``False`` if the node refused it (already known, its nonce used
        meanwhile, underpriced: the polling loop and the keeper sort it out)."""
        try:
            await self._w3.eth.send_raw_transaction(HexStr(raw))
        except Web3RPCError as exc:
            log.debug("node refused a transaction: %s", exc)
            return False
        return True

    async def _replace(self, key: str, sent: SentTx) -> None:
        """Re-sign ``sent`` with the same nonce and a higher gas price, journal it, send it
        (the caller holds the nonce lock)."""
        price = max(int(sent.gas_price * _REPLACEMENT_BUMP) + 1, await self.gas_price())
        version = await self._sign(sent.to, sent.data, sent.nonce, price, sent.gas)
        self._journal.record_sent(key, sent.replaced(version.hashes[0], version.raw, price, version.sent_ms))
        await self._broadcast(version.raw)

    async def _head_after(self, seen: int, until: float) -> int:
        """The chain head once it passes ``seen`` (or at ``until``).

        One coroutine polls ``eth_blockNumber`` for all waiters (the others wait on the lock and
        then read the cached head), so a hundred transactions in flight cost one poll, not a
        hundred, per interval.
        """
        async with self._head_lock:
            while self._head <= seen and time.monotonic() < until:
                self._head = await self._w3.eth.block_number
                if self._head <= seen:
                    await asyncio.sleep(self.poll_s)
            return self._head

    async def _await_confirmations(self, height: int) -> None:
        target = height + self.confirmations - 1
        deadline = time.monotonic() + self.tx_timeout_s
        head = -1
        while (head := await self._head_after(head, deadline)) < target:
            if time.monotonic() > deadline:
                raise DependencyTimeout(f"block {height} has fewer than {self.confirmations} confirmations")

    def _reverted(self, exc: ContractLogicError) -> ChainTransactionFailed:
        """A revert, named after the contract's custom error when its selector is in the answer
        (nodes put the revert data in different places: ``data`` itself or ``data.result``)."""
        text = f"{exc.data} {exc}"
        names = [name for selector, name in self._errors.items() if selector in text]
        return ChainTransactionFailed(f"{names[0]}: reverted" if names else f"reverted: {exc}")

    def _not_mined(self, key: str, mined: Any) -> ChainTransactionFailed:
        if mined is None:
            return ChainTransactionFailed(
                f"{key}: not registered yet; its nonce went to another transaction or another "
                "transaction registering it is pending"
            )
        self._journal.forget_sent(key)
        tx_hash = mined["transactionHash"].to_0x_hex()
        return ChainTransactionFailed(f"{key}: transaction {tx_hash} reverted (gas used {mined['gasUsed']})")
