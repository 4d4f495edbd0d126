"""Error policy: the one place that decides retry, retry topic, or dead letter for a failure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.platform.errors import NON_RETRIABLE
from app.platform.settings import Settings

__all__ = ["Decision", "RetryPolicy", "classify"]

#: What to do with a message whose handler raised.
Decision = Literal["retry_in_process", "retry_topic", "dead_letter"]


def classify(exc: BaseException) -> Literal["retriable", "non_retriable"]:
    """Non-retriable: undecodable bytes, schema and business-rule violations. Anything else
    (timeouts, unavailable dependencies, lock conflicts, unexpected bugs) is retried: a bug
    then reaches the DLQ after its retries, with the stack trace, instead of being lost."""
    return "non_retriable" if isinstance(exc, NON_RETRIABLE) else "retriable"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """In-process backoff delays, then ``topic_rounds`` rounds through the retry topic."""

    backoff_s: tuple[float, ...] = (1.0, 2.0, 4.0)
    topic_rounds: int = 1
    topic_delay_s: float = 8.0

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        """The policy configured by ``AVCC_RETRY_*``."""
        return cls(settings.retry_backoff_s, settings.retry_topic_rounds, settings.retry_topic_delay_s)

    def delay_before(self, in_process_attempt: int) -> float | None:
        """Delay before in-process retry ``in_process_attempt`` (1-based); ``None`` when exhausted."""
        if in_process_attempt <= len(self.backoff_s):
            return self.backoff_s[in_process_attempt - 1]
        return None

    def decide(self, exc: BaseException, in_process_attempt: int, topic_round: int) -> Decision:
        """What to do after failure number ``in_process_attempt`` (1-based) of a message that
        already made ``topic_round`` rounds through the retry topic: non-retriable failures are
        dead-lettered at once; retriable ones are retried in process while the backoff lasts,
        then sent through the retry topic (:meth:`after_in_process`)."""
        if classify(exc) == "non_retriable":
            return "dead_letter"
        if self.delay_before(in_process_attempt) is not None:
            return "retry_in_process"
        return self.after_in_process(exc, topic_round)

    def after_in_process(self, exc: BaseException, topic_round: int) -> Decision:
        """Where a message goes once its in-process retries are spent (``topic_round`` = rounds
        already made through the retry topic)."""
        if classify(exc) == "non_retriable":
            return "dead_letter"
        return "retry_topic" if topic_round < self.topic_rounds else "dead_letter"
