"""Exception hierarchy of the AVCC pipeline: one tree, rooted in :class:`AvccError`.

Every error the pipeline raises on purpose derives from :class:`AvccError`
(``tests/unit/test_errors.py`` walks every module and says so)::

    AvccError                       (defined with the contracts, the bottom floor: schemas.errors)
    ├── ConfigurationError          bad or missing settings; fix the environment and restart
    │   ├── KafkaAccessRefused      the broker refuses these credentials or ACLs (exit status says which)
    │   ├── PortInUse               a port the dev stack needs is taken (app.supervisor.ports)
    │   └── TablesFromAnotherBroker the workers' tables were built on another broker's data
    ├── NonRetriableError           retrying cannot help: the message goes straight to the DLQ
    │   └── BusinessRuleViolation   a well-formed event the domain refuses
    ├── RetriableError              a transient failure: back off, retry, then the retry topic
    │   ├── DependencyTimeout       a downstream call timed out
    │   ├── DependencyUnavailable   a downstream service (ClickHouse, chain node) is down
    │   ├── ChainTransactionFailed  the chain refused or reverted a transaction (nonce, gas, revert)
    │   └── LockConflict            a concurrent writer holds the resource
    ├── TopicPlanDrift              the broker's topics differ from the plan in a way we may not fix
    ├── BrokerCapabilityError       the broker cannot honour a producer profile
    ├── ContractError               (schemas.errors: the contracts import nothing from app)
    │   ├── UndecodableMessage      bytes that are not JSON / not an object
    │   └── SchemaViolation         JSON that breaks a payload contract (names the fields)
    ├── RequestRefused              an HTTP request refused: its response() is the JSON answer
    │   │                           (app.platform.http.responses; one error body on every route)
    │   ├── BadRequest              an unusable body or parameter (400, names the fields)
    │   ├── BatchError              a body that is no batch (400/413/415; TooManyItems)
    │   └── AuthenticationFailed, Forbidden, PayloadTooLarge, BodyTimeout, NonceStoreUnavailable
    ├── PeerError                   another worker unreachable or refusing (PeerUnreachable)
    ├── ReaderAborted               an offsets read stopped because its reader was closed
    ├── DlqError                    a DLQ console action refused (not found, refused, not caught up)
    ├── ConsoleError                the DLQ console answered the CLI with an error
    ├── ApiError                    the partner client got a refusal (DuplicateContent)
    ├── ServerStartError            a dev server did not start (ServerNotInstalled)
    ├── ShapeChanged                a faust/aiokafka private the project relies on changed (also ImportError)
    └── GitRefError                 the contract check could not read a git ref

:data:`NON_RETRIABLE` is what the error policy dead-letters at once: ``NonRetriableError`` and
every ``ContractError``.
"""

from __future__ import annotations

from typing import Final

from schemas.errors import AvccError, ContractError, SchemaViolation, UndecodableMessage

__all__ = [
    "NON_RETRIABLE",
    "AvccError",
    "BrokerCapabilityError",
    "BusinessRuleViolation",
    "ChainTransactionFailed",
    "ConfigurationError",
    "ContractError",
    "DependencyTimeout",
    "DependencyUnavailable",
    "LockConflict",
    "NonRetriableError",
    "RetriableError",
    "SchemaViolation",
    "TopicPlanDrift",
    "UndecodableMessage",
]


class ConfigurationError(AvccError):
    """Settings are missing or inconsistent. Fix the AVCC_* environment and restart."""


class NonRetriableError(AvccError):
    """Retrying cannot succeed; the message is dead-lettered at once with this reason."""


class BusinessRuleViolation(NonRetriableError):
    """A valid event the domain refuses (e.g. a transition from a final state)."""


class RetriableError(AvccError):
    """A transient failure: the error policy backs off and retries, then uses the retry topic."""


class DependencyTimeout(RetriableError):
    """A downstream call timed out. Check the dependency's latency; retries continue."""


class DependencyUnavailable(RetriableError):
    """A downstream service is unreachable. Restore it; consumption resumes by itself."""


class ChainTransactionFailed(RetriableError):
    """The chain node refused a transaction (nonce too low, out of gas) or it reverted.

    Retried with a fresh nonce and gas estimate; a transaction that keeps reverting reaches the
    DLQ with the revert reason. Check the signing key's balance and the contract address.
    """


class LockConflict(RetriableError):
    """A concurrent writer holds the resource; a retry normally succeeds."""


class TopicPlanDrift(AvccError):
    """The broker's topics differ from the topic plan in a way ``topics apply`` may not fix.

    Read the printed drift; grow partitions only with ``--grow-partitions`` (keys remap!).
    """


class BrokerCapabilityError(AvccError):
    """The broker cannot honour a producer profile (e.g. idempotence). Refused outside dev mode."""


#: Failures that retrying cannot fix: dead-lettered at once, never retried.
NON_RETRIABLE: Final[tuple[type[Exception], ...]] = (NonRetriableError, ContractError)
