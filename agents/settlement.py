"""settlement group (settlement-svc): wiring of settlement instructions and their clearing status.

``POST /v1/settlement/instructions`` turns a validated instruction into a ``chain.tx.pending``
(chain_type ``settlement``); the receipts on ``chain.tx.confirmed`` move the instruction's
clearing status to ``cleared`` or ``failed``. The logic lives in
:mod:`app.lifecycle.settlement.clearing`; the state (per instruction) in :mod:`tables.settlement`.
"""

from __future__ import annotations

from typing import Any

import faust
from aiohttp import web

from app.api import INSTRUCTION, SUBMIT_INSTRUCTION
from app.lifecycle.settlement.clearing import (
    InstructionRequest,
    clearing_update,
    instruction_pending,
    is_duplicate,
)
from app.platform.faust.app import get_app
from app.platform.faust.runtime import Effects, GroupRuntime, now_ms, source_topic
from app.platform.http.auth import signed_json
from app.platform.http.openapi import route
from app.platform.http.responses import json_error, json_response
from app.platform.http.routing import OwnerRouting
from app.platform.http.views import install_common_views
from app.platform.settings import get_settings
from app.platform.topics import CHAIN_TX_CONFIRMED
from schemas.chain import ChainTxConfirmed
from schemas.envelope import Envelope
from tables.settlement import clearing, parking

__all__ = ["app"]

app = get_app("settlement")
settings = get_settings()
runtime = GroupRuntime("settlement", "settlement-svc", app)
install_common_views(app, "settlement")
#: Who holds which partition of the clearing table, and the calls to them.
routing = OwnerRouting(app, clearing.table, settings)

confirmed = source_topic(app, CHAIN_TX_CONFIRMED)


async def handle_confirmed(envelope: Envelope[Any]) -> Effects:
    """Track settlement receipts; other chain types are not ours."""
    p = envelope.payload
    if not isinstance(p, ChainTxConfirmed) or p.chain_type != "settlement" or not p.instruction_id:
        return Effects()
    key = p.instruction_id
    previous = clearing.get(key)
    if is_duplicate(previous, envelope):
        return Effects(duplicate=True)
    record = clearing_update(previous, envelope, now_ms())
    return Effects(writes=[clearing.write(key, record)])


@app.agent(confirmed)
async def track_clearing(stream: Any) -> None:
    """chain.tx.confirmed (settlement) -> clearing status."""

    await runtime.consume(stream, handle_confirmed, parking=parking)


@route(app, SUBMIT_INSTRUCTION)
class Instructions(faust.web.View):
    """``POST``: submit a settlement instruction for notarisation on the settlement chain."""

    async def post(self, request: web.Request) -> web.Response:
        checked = await signed_json(request, settings, InstructionRequest, scope="settlement")
        if isinstance(checked, web.Response):
            return checked
        _, req = checked
        outgoing = instruction_pending(req)
        await runtime.emit([outgoing])
        answer = {
            "instruction_id": req.settlement.instruction_id,
            "status": "submitted",
            "event_id": str(outgoing.envelope.event_id),
        }
        return json_response(answer, 202)


@route(app, INSTRUCTION)
class InstructionStatus(faust.web.View):
    """``GET``: clearing status of an instruction (held by this worker's partitions)."""

    async def get(self, request: web.Request, instruction_id: str) -> web.Response:
        """Answered the same by every replica: the instruction is stored in the partition of
        its record, which the request does not name, so a replica that does not hold it asks
        its peers."""
        forwarded = await routing.table_wide_request(request, scope="settlement")
        if isinstance(forwarded, web.Response):
            return forwarded
        record = clearing.get(instruction_id)
        if record is not None:
            return json_response(record.public())
        if not forwarded:
            peers = await routing.fan_out(request, "first")
            if peers.answers:
                return peers.answers[0].answer
            if peers.refusal is not None:
                return peers.refusal
        return json_error(404, f"instruction {instruction_id} not cleared yet or unknown", reason="not_found")
