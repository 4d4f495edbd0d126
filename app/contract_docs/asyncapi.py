"""The AsyncAPI 3.0 document of the pipeline (``schemas/asyncapi.yaml``).

Built from the topic plan (partitions, retention, key, producer profile), the event flow
(``app.platform.flows``: which groups send and receive), the payload models (the same schemas as
``schemas/json``, with their ``$defs`` lifted into ``components.schemas``), the retry/DLQ header
metadata (``FailureMetadata``) and the published examples.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlparse

from pydantic import BaseModel

from app.contract_docs.examples import load_examples
from app.contract_docs.json_schemas import envelope_schema, model_schema
from app.platform.contracts import PAYLOAD_MODELS
from app.platform.faust.app import consumer_group_id
from app.platform.faust.runtime import HEADER_RETRY_ROUND
from app.platform.flows import flow_for
from app.platform.groups import group_spec
from app.platform.kafka.producers import PROFILES
from app.platform.settings import Settings
from app.platform.topics import DLQ, NONCES, RETRY, TOPIC_PLAN, TopicSpec
from schemas.system import FailureMetadata, header_name

__all__ = ["ASYNCAPI_VERSION", "KAFKA_BINDING_VERSION", "build_asyncapi", "channel_id"]

ASYNCAPI_VERSION: Final = "3.0.0"
KAFKA_BINDING_VERSION: Final = "0.5.0"
_FAILED_MESSAGE: Final = "FailedMessage"
_NONCE_CLAIM: Final = "NonceClaim"
_INT_HEADER: Final = {"type": "string", "pattern": "^-?[0-9]{1,19}$"}


def channel_id(topic: str) -> str:
    """The AsyncAPI id of a topic's channel: ``topic.avcc.apply.created`` -> ``avcc-apply-created``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", topic.removeprefix("topic."))


def _ref(*parts: str) -> dict[str, str]:
    return {"$ref": "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)}


def _lift(schema: Mapping[str, Any]) -> Any:
    """A pydantic schema with ``#/$defs/X`` rewritten to ``#/components/schemas/X``."""
    if isinstance(schema, Mapping):
        return {
            k: ("#/components/schemas/" + v.rsplit("/", 1)[1] if k == "$ref" else _lift(v))
            for k, v in schema.items()
            if k != "$defs"
        }
    if isinstance(schema, list):
        return [_lift(item) for item in schema]
    return schema


def _model_schemas(models: list[type[BaseModel]]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in models:
        full = model_schema(model)
        for name, sub in full.get("$defs", {}).items():
            schemas[name] = _lift(sub)
        schemas[model.__name__] = _lift(full)
        schemas[f"{model.__name__}Event"] = {
            "description": f"An envelope whose payload is a {model.__name__}.",
            "allOf": [
                _ref("components", "schemas", "Envelope"),
                {"properties": {"payload": _ref("components", "schemas", model.__name__)}},
            ],
        }
    return schemas


def _failure_headers() -> dict[str, Any]:
    """``avcc-*`` Kafka headers of retry/DLQ messages (UTF-8 text; integers in decimal)."""
    meta = FailureMetadata.model_json_schema(mode="validation")
    properties: dict[str, Any] = {}
    for field, sub in meta["properties"].items():
        integer = "integer" in {sub.get("type"), *(b.get("type") for b in sub.get("anyOf", []))}
        header = dict(_INT_HEADER) if integer else {"type": "string"}
        header["description"] = f"FailureMetadata.{field}" + (" (decimal)" if integer else "")
        properties[header_name(field)] = header
    properties[HEADER_RETRY_ROUND] = {
        **_INT_HEADER,
        "description": "retry topic only: how many rounds through the retry topic this message made",
    }
    return {
        "type": "object",
        "description": meta.get("description", ""),
        "properties": properties,
        "required": [header_name(f) for f in meta.get("required", [])],
    }


def _messages(examples: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    messages: dict[str, Any] = {}
    for topic, model in PAYLOAD_MODELS.items():
        name = model.__name__
        message = messages.setdefault(
            name,
            {
                "name": name,
                "title": name,
                "summary": (model.__doc__ or name).strip().splitlines()[0],
                "contentType": "application/json",
                "payload": _ref("components", "schemas", f"{name}Event"),
                "correlationId": {"location": "$message.payload#/event_id"},
            },
        )
        if topic in examples and "examples" not in message:
            message["examples"] = examples[topic]
    messages[_FAILED_MESSAGE] = {
        "name": _FAILED_MESSAGE,
        "title": "Failed message",
        "summary": "The original message, unchanged (same key and bytes), with failure metadata headers.",
        "contentType": "application/json",
        "headers": _ref("components", "schemas", "FailureHeaders"),
        "payload": {"description": "the original message's bytes, as they were on the original topic"},
    }
    messages[_NONCE_CLAIM] = {
        "name": _NONCE_CLAIM,
        "title": "Nonce claim",
        "summary": "A signed HTTP request's nonce, claimed by the replica that answers it; the first "
        "claim of a key id and nonce in log order wins.",
        "contentType": "text/plain",
        "payload": {
            "type": "string",
            "pattern": "^[0-9]{1,16}$",
            "description": "the request's X-AVCC-Timestamp (unix ms, decimal); the key is "
            "'<key id>\\n<nonce>'",
        },
    }
    return messages


def _message_name(spec: TopicSpec) -> str:
    if spec.name == NONCES.name:
        return _NONCE_CLAIM
    model = PAYLOAD_MODELS.get(spec.name)
    return model.__name__ if model is not None else _FAILED_MESSAGE


def _channel(spec: TopicSpec) -> dict[str, Any]:
    name = _message_name(spec)
    return {
        "address": spec.name,
        "title": spec.name,
        "description": spec.purpose,
        "messages": {name: _ref("components", "messages", name)},
        "bindings": {
            "kafka": {
                "topic": spec.name,
                "partitions": spec.partitions,
                "replicas": spec.replication_factor,
                "topicConfiguration": {
                    "cleanup.policy": [spec.cleanup_policy],
                    "retention.ms": spec.retention_ms,
                },
                "bindingVersion": KAFKA_BINDING_VERSION,
            }
        },
        "x-avcc-key": spec.key_field,
        "x-avcc-producer-profile": spec.profile,
    }


def _operations(spec: TopicSpec) -> dict[str, Any]:
    channel = channel_id(spec.name)
    messages = [_ref("channels", channel, "messages", _message_name(spec))]
    flow = flow_for(spec.name)
    operations: dict[str, Any] = {}
    sends = [(g, "produces") for g in flow.producers] + [(g, "redelivers") for g in flow.redeliverers]
    for group, verb in sends:
        operations[f"{group}-sends-{channel}"] = {
            "action": "send",
            "channel": _ref("channels", channel),
            "title": f"{group_spec(group).source} {verb} {spec.name}",
            "summary": f"Group {group} {verb} to {spec.name} with the {spec.profile} producer profile.",
            "messages": messages,
            "x-avcc-producer-config": dict(PROFILES[spec.profile]),
        }
    for group in flow.consumers:
        operations[f"{group}-receives-{channel}"] = {
            "action": "receive",
            "channel": _ref("channels", channel),
            "title": f"{group_spec(group).source} consumes {spec.name}",
            "summary": f"Consumer group {consumer_group_id(group)} reads {spec.name}.",
            "messages": messages,
            "bindings": {
                "kafka": {
                    "groupId": {"type": "string", "enum": [consumer_group_id(group)]},
                    "bindingVersion": KAFKA_BINDING_VERSION,
                }
            },
        }
    return operations


def _server() -> dict[str, Any]:
    url = urlparse(str(Settings.model_fields["kafka_url"].default))
    return {
        "local": {
            "host": url.netloc.split(";")[0],
            "protocol": "kafka",
            "description": "The embedded broker of `avcc dev` (set AVCC_KAFKA_URL for a real cluster).",
        }
    }


def build_asyncapi(version: str = "0.1.0") -> dict[str, Any]:
    """The whole AsyncAPI document as plain data (rendered to YAML by the generator)."""
    envelope = {k: v for k, v in envelope_schema().items() if k not in {"$schema", "$comment"}}
    schemas: dict[str, Any] = {"Envelope": envelope, "FailureHeaders": _failure_headers()}
    schemas.update(_model_schemas(list(dict.fromkeys(PAYLOAD_MODELS.values()))))
    operations: dict[str, Any] = {}
    for spec in TOPIC_PLAN:
        operations.update(_operations(spec))
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "AIGC-Hub AVCC events",
            "version": version,
            "description": (
                "Kafka topics of the AVCC event pipeline: every event is a JSON envelope "
                "{event_id, timestamp, source, payload}. Messages of a failing consumer go to "
                f"{RETRY.name} and then {DLQ.name} with their original bytes and key, plus avcc-* "
                "failure headers. Generated by `python -m app.contract_docs`; do not edit."
            ),
        },
        "defaultContentType": "application/json",
        "servers": _server(),
        "channels": {channel_id(spec.name): _channel(spec) for spec in TOPIC_PLAN},
        "operations": operations,
        "components": {"schemas": schemas, "messages": _messages(load_examples())},
    }
