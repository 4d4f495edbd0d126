"""RocksDB-backed faust tables of the agent groups, one module per group."""
