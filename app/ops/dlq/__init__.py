"""The dead-letter queue: its index, the operator console and the `avcc dlq` CLI."""
