"""Anomaly detection (replaces the Flink job): event-time windows and the seed's rules."""
