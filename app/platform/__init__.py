"""Platform: what every agent group stands on — settings, errors, metrics, the topic plan,
Kafka clients (`kafka/`), the faust app and runtime (`faust/`) and the HTTP stack (`http/`).

Nothing here knows a business rule; the domain packages (`lifecycle`, `playback`, `ops`) build on it.
"""
