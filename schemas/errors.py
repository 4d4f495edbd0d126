"""The root of every error the pipeline raises on purpose, and the errors a contract raises:
bytes that are not an event, or an event that breaks its schema.

They live here, on the bottom floor, so that the contracts import nothing from the pipeline and
still raise errors of its one tree (drawn in :mod:`app.platform.errors`); the pipeline's error
policy (``app.platform.errors.NON_RETRIABLE``) dead-letters every contract error at once.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["AvccError", "ContractError", "SchemaViolation", "UndecodableMessage"]


class AvccError(Exception):
    """Root of every error raised on purpose by the pipeline."""


class ContractError(AvccError):
    """A message that can never be processed as it is: retrying cannot help."""


class UndecodableMessage(ContractError):
    """The message bytes are not a JSON object. Inspect the producer that wrote them."""


class SchemaViolation(ContractError):
    """A payload breaks its contract. ``fields`` names every offending field (dotted paths).

    Fix the producer (or the payload, then re-inject it from the DLQ console).
    """

    def __init__(self, message: str, fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.fields: tuple[str, ...] = tuple(fields)
