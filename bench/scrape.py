"""A worker's histograms as Prometheus scrapes them from its ``/metrics`` (benches and tests)."""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from app.platform.metrics import TIME_TO_CODE_BUCKETS

__all__ = ["Scrape", "cumulative", "scrape"]

#: Upper bounds as the ``le`` label spells them, ``+Inf`` last.
_LE = [repr(bound) for bound in TIME_TO_CODE_BUCKETS] + ["+Inf"]


class Scrape:
    """Every sample of one scrape: ``(name, labels) -> value``."""

    def __init__(self, text: str) -> None:
        self.samples = [
            (sample.name, dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` whose labels include ``labels``."""
        return sum(
            value
            for sample, have, value in self.samples
            if sample == name and all(have.get(k) == v for k, v in labels.items())
        )

    def change(self, before: Scrape, name: str, **labels: str) -> float:
        """How much :meth:`total` grew since ``before``."""
        return self.total(name, **labels) - before.total(name, **labels)

    def buckets(self, histogram: str, **labels: str) -> list[float]:
        """Cumulative counts of a time-to-code histogram's buckets (``+Inf`` last), summed over
        the series whose labels include ``labels``."""
        return [self.total(f"{histogram}_bucket", **labels, le=le) for le in _LE]

    def since(self, before: Scrape, histogram: str, **labels: str) -> list[float]:
        """What :meth:`buckets` counted between ``before`` and this scrape."""
        now, then = self.buckets(histogram, **labels), before.buckets(histogram, **labels)
        return [a - b for a, b in zip(now, then, strict=True)]


def scrape(base_url: str) -> Scrape:
    """Scrape ``base_url``/metrics."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        return Scrape(response.read().decode())


def cumulative(seconds: Sequence[float], bounds: Sequence[float] = TIME_TO_CODE_BUCKETS) -> list[float]:
    """The cumulative buckets ``seconds`` fall into (``+Inf`` last), as the histogram counts them."""
    return [float(sum(1 for s in seconds if s <= bound)) for bound in bounds] + [float(len(seconds))]
