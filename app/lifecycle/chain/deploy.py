"""Deploying AvccRegistry (``avcc chain deploy``, the dev stack) and finding the configured one."""

from __future__ import annotations

import asyncio

from eth_account import Account
from web3 import AsyncWeb3

from app.lifecycle.chain.registry import load_artefact
from app.platform.errors import ConfigurationError, DependencyUnavailable
from app.platform.settings import Settings

__all__ = ["contract_deployed", "deploy_registry", "require_contract"]


def require_contract(settings: Settings) -> str:
    """``AVCC_CHAIN_CONTRACT`` (``ConfigurationError`` when unset)."""
    if not settings.chain_contract:
        raise ConfigurationError(
            "AVCC_CHAIN_CONTRACT is unset: deploy the registry with `avcc chain deploy` and set it"
        )
    return settings.chain_contract


async def _deploy(url: str, private_key: str, timeout_s: float) -> str:
    w3 = AsyncWeb3(AsyncWeb3.AsyncHTTPProvider(url))
    try:
        account = Account.from_key(private_key)
        artefact = load_artefact()
        factory = w3.eth.contract(abi=artefact.abi, bytecode=artefact.bytecode)
        fields = await factory.constructor().build_transaction(
            {
                "from": account.address,
                "nonce": await w3.eth.get_transaction_count(account.address, "pending"),
                "gasPrice": await w3.eth.gas_price,
                "chainId": await w3.eth.chain_id,
            }
        )
        signed = account.sign_transaction(fields)
        tx_hash = await w3.eth.send_raw_transaction(signed.raw_transaction)
        receipt = await w3.eth.wait_for_transaction_receipt(tx_hash, timeout=timeout_s)
        if receipt["status"] != 1 or not receipt["contractAddress"]:
            raise DependencyUnavailable(f"deploying AvccRegistry failed: receipt {dict(receipt)}")
        return str(receipt["contractAddress"])
    finally:
        await w3.provider.disconnect()


def deploy_registry(url: str, private_key: str, timeout_s: float = 60.0) -> str:
    """Deploy AvccRegistry from the checked-in artefact, signed by ``private_key``; its address."""
    return asyncio.run(_deploy(url, private_key, timeout_s))


async def _has_code(url: str, address: str) -> bool:
    w3 = AsyncWeb3(AsyncWeb3.AsyncHTTPProvider(url))
    try:
        return len(await w3.eth.get_code(AsyncWeb3.to_checksum_address(address))) > 0
    finally:
        await w3.provider.disconnect()


def contract_deployed(url: str, address: str) -> bool:
    """True when ``address`` holds contract code on the node at ``url``."""
    if not address:
        raise ConfigurationError("no contract address given")
    return asyncio.run(_has_code(url, address))
