"""chain-svc: notarisation behind the ChainBackend protocol (local ledger or an EVM chain)."""
