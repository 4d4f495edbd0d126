"""clickhouse-sink: columnar validation and batched, idempotent inserts into ClickHouse."""
