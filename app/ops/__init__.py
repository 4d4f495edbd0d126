"""Operations: retry forwarding, the DLQ (store, console, CLI), consumer lag, alerts, service levels."""
