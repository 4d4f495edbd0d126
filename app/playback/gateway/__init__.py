"""gateway-svc: signed playback batches from partners onto topic.playback.event."""
