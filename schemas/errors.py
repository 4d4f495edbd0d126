"""Errors a contract raises: bytes that are not an event, or an event that breaks its schema.

They live here, not in ``app``, so that the contracts import nothing from the pipeline; the
pipeline's error policy (``app.platform.errors.NON_RETRIABLE``) dead-letters both at once.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ContractError", "SchemaViolation", "UndecodableMessage"]


class ContractError(Exception):
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
