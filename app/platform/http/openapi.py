"""The HTTP API as OpenAPI 3.1: each route declared once, documented per worker and merged.

An :class:`Operation` holds everything a partner needs about one route: method, path, the scope
its key must hold, the request body model or query parameters, and every answer it can give
(status -> schema). From the same declarations come

* ``GET /openapi.json`` of each worker (:func:`install_openapi`: its own routes plus the probes),
* the merged partner document ``schemas/openapi.yaml`` (written by ``app.contract_docs``),
* the mounting of the view itself (:func:`route`), so a route cannot exist undocumented.

Every error answer has one shape, :data:`ERROR_SCHEMA` (``{"error", "reason", ...}`` of
:func:`app.platform.http.responses.json_error`). Signed routes carry the four HMAC headers as
apiKey security schemes and their scope as ``x-avcc-scope``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from pydantic import BaseModel

from app.platform.credentials import Scope
from app.platform.http.signing import HEADER_KEY, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP
from schemas.types import MAX_EPOCH_MS

if TYPE_CHECKING:
    import faust

__all__ = [
    "API_VERSION",
    "DOCUMENT_ROUTE",
    "EPOCH_MS",
    "ERROR_SCHEMA",
    "INTEGER",
    "PROBES",
    "STRING",
    "Body",
    "Operation",
    "Param",
    "Reply",
    "build_document",
    "install_openapi",
    "route",
    "worker_document",
]

DOCUMENT_ROUTE: Final = "/openapi.json"
#: Version of the HTTP API (``info.version``); bump it with a change partners must see.
API_VERSION: Final = "1.0.0"
OPENAPI_VERSION: Final = "3.1.0"
_REF: Final = "#/components/schemas/{model}"
_SECURITY_NAMES: Final = {
    "avccKey": HEADER_KEY,
    "avccTimestamp": HEADER_TIMESTAMP,
    "avccNonce": HEADER_NONCE,
    "avccSignature": HEADER_SIGNATURE,
}
_SECURITY_TEXT: Final = {
    "avccKey": "API key id.",
    "avccTimestamp": "Unix milliseconds of signing (within the server's skew window).",
    "avccNonce": "8-128 printable ASCII characters, never reused by the key.",
    "avccSignature": (
        "Hex HMAC-SHA256 of METHOD, path+query, timestamp, nonce and the body's SHA-256, "
        "one per line (see app.platform.http.signing)."
    ),
}

#: JSON schemas the route declarations of every domain are written with.
STRING: Final[Mapping[str, Any]] = {"type": "string"}
INTEGER: Final[Mapping[str, Any]] = {"type": "integer"}
#: Epoch milliseconds, as every ``*_ms`` parameter takes them.
EPOCH_MS: Final[Mapping[str, Any]] = {"type": "integer", "minimum": 0, "maximum": MAX_EPOCH_MS}

#: ``{"error", "reason", ...}``: every refusal and error of every route.
ERROR_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["error", "reason"],
    "properties": {
        "error": {"type": "string", "description": "What went wrong, for a person."},
        "reason": {"type": "string", "description": "A fixed word a program can branch on."},
        "retry_after_s": {"type": "integer", "minimum": 1, "description": "Also sent as Retry-After."},
        "fields": {"type": "array", "items": {"type": "string"}, "description": "Offending fields."},
    },
    "additionalProperties": True,
}

_ERROR_TEXT: Final = {
    400: "The request is invalid (`fields` names what).",
    401: "Missing, malformed, stale or wrong signature, or a reused nonce.",
    403: "The key lacks the route's scope (`required` names it).",
    404: "Not found.",
    408: "The body did not arrive in time.",
    409: "The target is not in a state that allows this.",
    413: "The body is larger than the route accepts.",
    415: "Unsupported Content-Type.",
    429: "Saturated: retry after `Retry-After` seconds.",
    503: "Temporarily unavailable (rebalancing, a dependency away): retry after `Retry-After`.",
}
#: Answers every signed route can give before its own logic runs.
_SIGNED_REFUSALS: Final = (401, 403, 408, 413, 503)


@dataclass(frozen=True, slots=True)
class Param:
    """A path or query parameter and its JSON schema."""

    name: str
    schema: Mapping[str, Any]
    description: str = ""
    where: str = "query"


@dataclass(frozen=True, slots=True)
class Body:
    """A JSON request body: a model, or a JSON array of a model (``array=True``)."""

    model: type[BaseModel]
    array: bool = False
    description: str = ""


@dataclass(frozen=True, slots=True)
class Reply:
    """A success answer: its status, what it means and its JSON schema (a model or a schema)."""

    status: int
    description: str
    schema: type[BaseModel] | Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})
    content_type: str = "application/json"


@dataclass(frozen=True, slots=True)
class Operation:
    """One route of the HTTP API, declared once (see the module docstring)."""

    method: str
    path: str
    summary: str
    replies: tuple[Reply, ...]
    scope: Scope | None = None
    body: Body | None = None
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = ()
    tag: str = "probes"

    @property
    def operation_id(self) -> str:
        """A stable id from the method and path."""
        words = [w.strip("{}") for w in self.path.strip("/").split("/") if w]
        return "_".join([self.method.lower(), *(w.replace(".", "_") for w in words)])

    def statuses(self) -> list[int]:
        """Every status this route can answer, ascending."""
        refusals = _SIGNED_REFUSALS if self.scope is not None else ()
        extra = (400,) if self.body is not None or self.params else ()
        return sorted({*(r.status for r in self.replies), *refusals, *extra, *self.errors})


def _json_schema(schema: Any, components: dict[str, Any]) -> Any:
    """``schema`` with every model in it replaced by a ``$ref``; the models' definitions go to
    ``components`` (one name, one schema)."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        document = schema.model_json_schema(ref_template=_REF)
        for name, definition in {**document.pop("$defs", {}), schema.__name__: document}.items():
            if components.setdefault(name, definition) != definition:
                raise ValueError(f"two different schemas are both called {name!r}")
        return {"$ref": _REF.format(model=schema.__name__)}
    if isinstance(schema, Mapping):
        return {key: _json_schema(value, components) for key, value in schema.items()}
    if isinstance(schema, list | tuple):
        return [_json_schema(value, components) for value in schema]
    return schema


def _operation(op: Operation, components: dict[str, Any]) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    replies = {r.status: r for r in op.replies}
    for status in op.statuses():
        reply = replies.get(status)
        if reply is not None:
            schema = _json_schema(reply.schema, components)
            content = {reply.content_type: {"schema": schema}}
            responses[str(status)] = {"description": reply.description, "content": content}
        else:
            content = {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}}
            responses[str(status)] = {"description": _ERROR_TEXT.get(status, "Error."), "content": content}
    document: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.tag],
        "responses": responses,
    }
    if op.params:
        document["parameters"] = [
            {
                "name": p.name,
                "in": p.where,
                "required": p.where == "path",
                "description": p.description,
                "schema": dict(p.schema),
            }
            for p in op.params
        ]
    if op.body is not None:
        item = _json_schema(op.body.model, components)
        schema = {"type": "array", "items": item} if op.body.array else item
        document["requestBody"] = {
            "required": True,
            "description": op.body.description,
            "content": {"application/json": {"schema": schema}},
        }
    if op.scope is not None:
        document["security"] = [{name: [] for name in _SECURITY_NAMES}]
        document["x-avcc-scope"] = op.scope
    else:
        document["security"] = []
    return document


def build_document(operations: Iterable[Operation], *, title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations`` (JSON-ready, keys in a stable order)."""
    components: dict[str, Any] = {"Error": ERROR_SCHEMA}
    paths: dict[str, dict[str, Any]] = {}
    for op in sorted(operations, key=lambda o: (o.path, o.method)):
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, components)
    schemes = {
        name: {"type": "apiKey", "in": "header", "name": header, "description": _SECURITY_TEXT[name]}
        for name, header in _SECURITY_NAMES.items()
    }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": title,
            "version": version,
            "description": (
                "Signed routes need all four X-AVCC-* headers (HMAC-SHA256) and a key holding the "
                "operation's x-avcc-scope. Errors are {error, reason, ...}."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": schemes,
        },
    }


_TEXT: Final = {"type": "string"}
#: The machine views every worker serves (:mod:`app.platform.http.views`) and the document itself.
PROBES: Final = (
    Operation("GET", "/health", "Liveness: the event loop answers.", (Reply(200, "Alive"),), errors=(503,)),
    Operation("GET", "/ready", "Readiness: assigned and recovered.", (Reply(200, "Ready"),), errors=(503,)),
    Operation(
        "GET",
        "/metrics",
        "Prometheus metrics (text exposition format 0.0.4).",
        (Reply(200, "Metrics.", _TEXT, "text/plain"),),
    ),
    Operation("GET", DOCUMENT_ROUTE, "This worker's OpenAPI 3.1 document.", (Reply(200, "The document."),)),
)

_V = TypeVar("_V", bound=type[Any])
_DOCUMENTED_ATTR: Final = "_avcc_openapi_operations"


def _declared(app: faust.App) -> list[Operation]:
    operations: list[Operation] | None = getattr(app, _DOCUMENTED_ATTR, None)
    if operations is None:
        operations = []
        setattr(app, _DOCUMENTED_ATTR, operations)
    return operations


def route(app: faust.App, *operations: Operation) -> Callable[[_V], _V]:
    """Mount a faust ``View`` on the path of ``operations`` (one path, one method each) and add
    them to the worker's document."""
    paths = {op.path for op in operations}
    if len(paths) != 1:
        raise ValueError(f"one view serves one path, not {sorted(paths)}")
    _declared(app).extend(operations)
    return cast(Callable[[_V], _V], app.page(paths.pop()))


def worker_document(app: faust.App, group: str, version: str = API_VERSION) -> dict[str, Any]:
    """The document of ``app``: the operations mounted with :func:`route` plus :data:`PROBES`."""
    return build_document([*_declared(app), *PROBES], title=f"AVCC {group} worker", version=version)


def install_openapi(app: faust.App, group: str) -> None:
    """Serve ``GET /openapi.json``: :func:`worker_document` (built per request: cheap, and it
    includes routes mounted after this call)."""

    async def openapi(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.json(worker_document(app, group))

    app.page(DOCUMENT_ROUTE, name=f"avcc_{group}_openapi")(openapi)
