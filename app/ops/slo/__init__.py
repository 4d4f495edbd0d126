"""Service levels of the seed's promise, as code: time to code per level and the wait for a person.

``settings`` holds the objectives (``AVCC_SLO_*``, defaults from the seed); ``rules`` turns them
into Prometheus recording and multiwindow burn-rate alerting rules (``deploy/render.py`` writes
them); ``report`` reads the code group's last hour (``GET /v1/avcc/time-to-code``) for the
console: quantiles, compliance and the error budget left, per level.
"""
