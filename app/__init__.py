"""AVCC event pipeline: settings, topic plan, Kafka clients and the faust apps."""
