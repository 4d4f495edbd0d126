"""Kafka clients: murmur2 partitioner, admin (topic plan apply), confluent-kafka producers."""
