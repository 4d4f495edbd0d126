"""settlement group (settlement-svc): settlement instructions and their clearing status.

``POST /v1/settlement/instructions`` turns a validated instruction into a ``chain.tx.pending``
(chain_type ``settlement``); the receipts on ``chain.tx.confirmed`` move the instruction's
clearing status to ``cleared`` or ``failed``. Status is kept per instruction in ``clearing``.
"""

from __future__ import annotations

import uuid
from typing import Any

import faust
import orjson
from aiohttp import web
from pydantic import Field

from app.platform.faust.app import get_app
from app.platform.faust.runtime import Effects, GroupRuntime, Outgoing, now_ms
from app.platform.http.routing import BadRequest, authorize, json_error, json_response, parse_body
from app.platform.http.views import install_common_views
from app.platform.settings import get_settings
from app.platform.topics import CHAIN_TX_CONFIRMED, CHAIN_TX_PENDING
from schemas.chain import ChainTxConfirmed, ChainTxPending, SettlementInstruction
from schemas.envelope import Envelope, make_envelope
from schemas.types import ContractModel, Identifier, RecordId
from tables.settlement import clearing

__all__ = ["app", "clearing_update"]

app = get_app("settlement")
settings = get_settings()
runtime = GroupRuntime("settlement", "settlement-svc", app)
install_common_views(app, "settlement")

EVENT_NS = uuid.UUID("c3a1e6d2-51f4-4f0e-9a7b-1d2e3f4a5b61")

confirmed = app.topic(
    CHAIN_TX_CONFIRMED.name,
    partitions=CHAIN_TX_CONFIRMED.partitions,
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
parking = runtime.parking_table("settlement-confirmed", CHAIN_TX_CONFIRMED.partitions)


class InstructionRequest(ContractModel):
    """Body of ``POST /v1/settlement/instructions``."""

    avcc_record_id: RecordId
    request_id: Identifier
    settlement: SettlementInstruction
    note: str | None = Field(None, max_length=500)


def clearing_update(
    previous: dict[str, Any] | None, envelope: Envelope[ChainTxConfirmed], now: int
) -> dict[str, Any]:
    """New clearing record for a settlement receipt (pure; a cleared instruction stays cleared)."""
    p = envelope.payload
    record = dict(previous or {"instruction_id": p.instruction_id, "history": []})
    if record.get("status") == "cleared":
        return record
    status = "cleared" if p.status == "success" else "failed"
    record.update(
        {
            "avcc_record_id": p.avcc_record_id,
            "status": status,
            "tx_hash": p.tx_hash,
            "block_height": p.block_height,
            "error": p.error,
            "updated_ms": now,
            "history": [
                *record.get("history", []),
                {"at_ms": now, "status": status, "event_id": str(envelope.event_id)},
            ],
        }
    )
    return record


async def handle_confirmed(envelope: Envelope[Any]) -> Effects:
    """Track settlement receipts; other chain types are not ours."""
    p = envelope.payload
    if not isinstance(p, ChainTxConfirmed) or p.chain_type != "settlement" or not p.instruction_id:
        return Effects()
    key = p.instruction_id.encode()
    raw = clearing.get(key)
    previous = orjson.loads(raw) if raw else None
    if previous and any(h["event_id"] == str(envelope.event_id) for h in previous.get("history", [])):
        return Effects(duplicate=True)
    record = clearing_update(previous, envelope, now_ms())

    def store() -> None:
        clearing[key] = orjson.dumps(record)

    return Effects(apply=store)


@app.agent(confirmed)
async def track_clearing(stream: Any) -> None:
    """chain.tx.confirmed (settlement) -> clearing status."""
    async for event in stream.events():
        await runtime.process(event, handle_confirmed, parking=parking)


ROUTE_SUBMIT = "/v1/settlement/instructions"
ROUTE_STATUS = "/v1/settlement/instructions/{instruction_id}"


@app.page(ROUTE_SUBMIT)
class Instructions(faust.web.View):
    """``POST``: submit a settlement instruction for notarisation on the settlement chain."""

    async def post(self, request: web.Request) -> web.Response:
        body = await request.read()
        denied = await authorize(request, body, settings, route=ROUTE_SUBMIT)
        if denied is not None:
            return denied
        try:
            req = parse_body(InstructionRequest, body)
        except BadRequest as exc:
            return json_error(400, str(exc), ROUTE_SUBMIT, "POST", fields=list(exc.fields))
        instruction_id = req.settlement.instruction_id
        payload = ChainTxPending(
            avcc_record_id=req.avcc_record_id,
            chain_type="settlement",
            idempotency_key=f"settlement-{instruction_id}",
            request_id=req.request_id,
            settlement=req.settlement,
        )
        envelope = make_envelope(
            payload, source="settlement-svc", event_id=uuid.uuid5(EVENT_NS, f"instruction:{instruction_id}")
        )
        await runtime.emit([Outgoing(CHAIN_TX_PENDING, envelope, req.avcc_record_id)])
        answer = {"instruction_id": instruction_id, "status": "submitted", "event_id": str(envelope.event_id)}
        return json_response(answer, 202, ROUTE_SUBMIT, "POST")


@app.page(ROUTE_STATUS)
class InstructionStatus(faust.web.View):
    """``GET``: clearing status of an instruction (held by this worker's partitions)."""

    async def get(self, request: web.Request, instruction_id: str) -> web.Response:
        denied = await authorize(request, await request.read(), settings, route=ROUTE_STATUS)
        if denied is not None:
            return denied
        raw = clearing.get(instruction_id.encode())
        if raw is None:
            return json_error(
                404, f"instruction {instruction_id} not cleared yet or unknown", ROUTE_STATUS, "GET"
            )
        return json_response(orjson.loads(raw), 200, ROUTE_STATUS, "GET")
