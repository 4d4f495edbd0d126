"""Playback: the partner firehose — gateway ingest, ClickHouse sink, anomaly detection."""
