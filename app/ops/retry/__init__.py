"""The retry forwarder: delayed redelivery of ``topic.system.retry`` to the original topics."""
