"""chain-svc: the notarisation ledger behind the ChainBackend protocol."""
