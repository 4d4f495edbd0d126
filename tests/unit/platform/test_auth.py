"""HMAC request authentication: the good path and every refusal reason."""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any, cast

import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

from app.platform.http.auth import (
    HEADER_KEY,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    KEY_ID_ATTRIBUTE,
    AuthenticationFailed,
    BodyTimeout,
    Forbidden,
    NonceCache,
    PayloadTooLarge,
    RequestRefused,
    authenticate,
    read_body,
    require_hmac,
    sign_request,
    verify_headers,
)
from app.platform.http.responses import json_error
from app.platform.metrics import AUTH_FAILURES
from app.platform.settings import Settings

SECRET = "s3cret-partner-a"
PATH = "/v1/playback/events?dry=1"
BODY = b'[{"a":1}]'


@pytest.fixture
def settings() -> Settings:
    return Settings(hmac_keys={"partner-a": SECRET}, hmac_max_skew_ms=60_000)


@pytest.fixture
def nonces() -> NonceCache:
    return NonceCache(ttl_ms=120_000)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def check(settings: Settings, nonces: NonceCache, headers: dict[str, str], **kw: Any) -> str:
    return verify_headers(
        kw.pop("method", "POST"),
        kw.pop("path", PATH),
        headers,
        kw.pop("body", BODY),
        settings,
        nonces=nonces,
        **kw,
    )


def reason_of(settings: Settings, nonces: NonceCache, headers: dict[str, str], **kw: Any) -> str:
    with pytest.raises(AuthenticationFailed) as info:
        check(settings, nonces, headers, **kw)
    return info.value.reason


def test_good_signature_passes_and_matches_documented_canonical_form(
    settings: Settings, nonces: NonceCache
) -> None:
    headers = sign_request("POST", PATH, BODY, "partner-a", SECRET, timestamp_ms=now_ms(), nonce="nonce-0001")
    canonical = f"POST\n{PATH}\n{headers[HEADER_TIMESTAMP]}\nnonce-0001\n{hashlib.sha256(BODY).hexdigest()}"
    expected = hmac.new(SECRET.encode(), canonical.encode(), hashlib.sha256).hexdigest()
    assert headers[HEADER_SIGNATURE] == expected
    assert check(settings, nonces, headers) == "partner-a"


def test_upper_case_signature_accepted(settings: Settings, nonces: NonceCache) -> None:
    headers = sign_request("POST", PATH, BODY, "partner-a", SECRET)
    headers[HEADER_SIGNATURE] = headers[HEADER_SIGNATURE].upper()
    assert check(settings, nonces, headers) == "partner-a"


@pytest.mark.parametrize("missing", [HEADER_KEY, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE])
def test_missing_header(settings: Settings, nonces: NonceCache, missing: str) -> None:
    headers = sign_request("POST", PATH, BODY, "partner-a", SECRET)
    del headers[missing]
    assert reason_of(settings, nonces, headers) == "missing_header"


def test_malformed_timestamp_and_nonce_are_missing_header(settings: Settings, nonces: NonceCache) -> None:
    headers = sign_request("POST", PATH, BODY, "partner-a", SECRET)
    assert reason_of(settings, nonces, {**headers, HEADER_TIMESTAMP: "12.5"}) == "missing_header"
    assert reason_of(settings, nonces, {**headers, HEADER_NONCE: "short"}) == "missing_header"


def test_unknown_key(settings: Settings, nonces: NonceCache) -> None:
    headers = sign_request("POST", PATH, BODY, "partner-b", SECRET)
    assert reason_of(settings, nonces, headers) == "unknown_key"


@pytest.mark.parametrize(
    "tamper",
    [
        {"body": b'[{"a":2}]'},
        {"path": "/v1/playback/events"},
        {"path": "/v1/playback/events?dry=2"},
        {"method": "PUT"},
    ],
    ids=["body", "query-dropped", "query-changed", "method"],
)
def test_bad_signature_on_any_tampering(
    settings: Settings, nonces: NonceCache, tamper: dict[str, Any]
) -> None:
    headers = sign_request("POST", PATH, BODY, "partner-a", SECRET)
    assert reason_of(settings, nonces, headers, **tamper) == "bad_signature"


def test_bad_signature_wrong_secret_and_garbage(settings: Settings, nonces: NonceCache) -> None:
    headers = sign_request("POST", PATH, BODY, "partner-a", "wrong")
    assert reason_of(settings, nonces, headers) == "bad_signature"
    assert reason_of(settings, nonces, {**headers, HEADER_SIGNATURE: "zz" * 32}) == "bad_signature"
    assert reason_of(settings, nonces, {**headers, HEADER_SIGNATURE: "ab"}) == "bad_signature"


@pytest.mark.parametrize("offset_ms", [-61_000, 61_000])
def test_stale_timestamp_either_way(settings: Settings, nonces: NonceCache, offset_ms: int) -> None:
    headers = sign_request("POST", PATH, BODY, "partner-a", SECRET, timestamp_ms=now_ms() + offset_ms)
    assert reason_of(settings, nonces, headers) == "stale_timestamp"


def test_replayed_nonce(settings: Settings, nonces: NonceCache) -> None:
    headers = sign_request("POST", PATH, BODY, "partner-a", SECRET)
    assert check(settings, nonces, headers) == "partner-a"
    assert reason_of(settings, nonces, headers) == "replayed_nonce"


def test_forged_request_does_not_burn_the_nonce(settings: Settings, nonces: NonceCache) -> None:
    good = sign_request("POST", PATH, BODY, "partner-a", SECRET, nonce="nonce-shared")
    forged = {**good, HEADER_SIGNATURE: "0" * 64}
    assert reason_of(settings, nonces, forged) == "bad_signature"
    assert check(settings, nonces, good) == "partner-a"


def test_nonce_cache_bounded_without_reopening_replays() -> None:
    cache = NonceCache(ttl_ms=10_000, capacity=2)
    now = 1_000_000
    assert cache.check_and_add("k", "n1", now - 5, now) is None
    assert cache.check_and_add("k", "n2", now - 3, now) is None
    assert cache.check_and_add("k", "n3", now - 1, now) is None  # evicts n1
    assert len(cache) == 2
    assert cache.check_and_add("k", "n1", now - 5, now) == "stale_timestamp"  # evicted: refused anyway
    assert cache.check_and_add("k", "n2", now - 3, now) == "replayed_nonce"
    assert cache.check_and_add("k", "n4", now, now + 20_000) is None  # the others expired
    assert len(cache) == 1


def test_failures_counted_by_reason(settings: Settings, nonces: NonceCache) -> None:
    before = AUTH_FAILURES.labels("unknown_key")._value.get()
    reason_of(settings, nonces, sign_request("POST", PATH, BODY, "nobody", SECRET))
    assert AUTH_FAILURES.labels("unknown_key")._value.get() == before + 1


def test_dev_mode_key(nonces: NonceCache) -> None:
    dev = Settings(dev_mode=True)
    assert check(dev, nonces, sign_request("POST", PATH, BODY, "dev", "dev-secret")) == "dev"
    assert (
        reason_of(Settings(), nonces, sign_request("POST", PATH, BODY, "dev", "dev-secret")) == "unknown_key"
    )


class FakeStream:
    def __init__(self, body: bytes, chunk: int = 4) -> None:
        self.chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)]

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


class FakeRequest(dict[str, Any]):
    def __init__(
        self, headers: dict[str, str], body: bytes, path_qs: str = PATH, declared: bool = True
    ) -> None:
        super().__init__()
        self.method = "POST"
        self.path_qs = path_qs
        self.headers = CIMultiDict(headers)
        self.body = body
        self.content = FakeStream(body)
        self.content_length = len(body) if declared else None

    async def read(self) -> bytes:
        return self.body


async def test_authenticate_reads_request_and_headers_are_case_insensitive(
    settings: Settings, nonces: NonceCache
) -> None:
    headers = {k.lower(): v for k, v in sign_request("POST", PATH, BODY, "partner-a", SECRET).items()}
    signed = await authenticate(FakeRequest(headers, BODY), settings, scope="playback:write", nonces=nonces)
    assert signed.key_id == "partner-a"


async def test_authenticate_refusal_is_401_json_and_the_owner_claims_the_nonce(
    settings: Settings, nonces: NonceCache
) -> None:
    headers = sign_request("POST", PATH, BODY, "partner-a", SECRET)
    request = FakeRequest(headers, BODY)
    signed = await authenticate(request, settings, scope="playback:write", nonces=nonces)
    assert signed.key_id == "partner-a" and signed.body == BODY
    assert request[KEY_ID_ATTRIBUTE] == "partner-a"
    with pytest.raises(RequestRefused) as info:
        await authenticate(FakeRequest(headers, BODY), settings, scope="playback:write", nonces=nonces)
    denied = info.value.response()
    assert denied.status == 401 and denied.body is not None
    assert orjson.loads(cast(bytes, denied.body)) == {
        "error": "nonce already used",
        "reason": "replayed_nonce",
    }
    # a worker that forwards to the record's owner checks signature and scope only
    fresh = sign_request("POST", PATH, b"", "partner-a", SECRET)
    checked = await authenticate(
        FakeRequest(fresh, b""), settings, scope="records:read", nonces=nonces, check_nonce=False
    )
    assert not nonces.contains("partner-a", fresh[HEADER_NONCE], now_ms())
    assert checked.key_id == "partner-a"


SCOPED = Settings(
    hmac_keys={"partner-a": {"secret": "s3cret-partner-a-000", "scopes": ["playback:write", "playback:read"]}}
)


async def test_a_key_uses_only_its_scopes() -> None:
    cache = NonceCache(ttl_ms=120_000)
    ok = sign_request("POST", PATH, BODY, "partner-a", "s3cret-partner-a-000")
    await authenticate(FakeRequest(ok, BODY), SCOPED, scope="playback:write", nonces=cache)
    decision = sign_request("POST", PATH, BODY, "partner-a", "s3cret-partner-a-000")
    with pytest.raises(Forbidden) as info:
        await authenticate(FakeRequest(decision, BODY), SCOPED, scope="review:decide", nonces=cache)
    answer = info.value.response()
    assert answer.status == 403
    assert orjson.loads(cast(bytes, answer.body)) == {
        "error": "this key may not use this route; it needs the scope 'review:decide'",
        "reason": "scope",
        "required": "review:decide",
    }
    # an out-of-scope request does not burn its nonce
    assert not cache.contains("partner-a", decision[HEADER_NONCE], now_ms())


def test_a_bare_secret_keeps_every_scope() -> None:
    (key,) = Settings(hmac_keys={"partner-a": SECRET}).api_keys().values()
    assert all(key.allows(scope) for scope in ("apply", "records:read", "review:decide", "settlement"))
    assert Settings(dev_mode=True).api_keys()["dev"].allows("review:decide")


@pytest.mark.parametrize(
    "keys",
    [
        {"partner-a": ""},
        {"partner-a": "   "},
        {"partner-a": "CHANGE-ME"},
        {"partner-a": {"secret": "change-me-please", "scopes": ["apply"]}},
        {"partner-a": {"secret": "s3cret-partner-a-000", "scopes": []}},
        {"partner-a": {"secret": "s3cret-partner-a-000", "scopes": ["root"]}},
    ],
)
def test_weak_secrets_and_bad_scopes_are_refused_at_start(keys: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Settings(hmac_keys=keys)


def test_placeholder_operator_password_is_refused() -> None:
    with pytest.raises(ValueError):
        Settings(operator_users={"ops": "CHANGE-ME"})


def test_unknown_key_is_answered_like_a_bad_signature(settings: Settings, nonces: NonceCache) -> None:
    with pytest.raises(AuthenticationFailed) as unknown:
        check(settings, nonces, sign_request("POST", PATH, BODY, "partner-b", SECRET))
    with pytest.raises(AuthenticationFailed) as wrong:
        check(settings, nonces, sign_request("POST", PATH, BODY, "partner-a", "wrong-secret"))
    assert unknown.value.reason == "unknown_key"  # the metric still tells them apart
    assert unknown.value.response().body == wrong.value.response().body


class StalledStream:
    def __init__(self) -> None:
        self.reads = 0

    async def readany(self) -> bytes:
        import asyncio

        self.reads += 1
        await asyncio.sleep(3600)
        return b""


async def test_headers_are_checked_before_any_body_byte_is_read(settings: Settings) -> None:
    request = FakeRequest({"X-AVCC-Key": "partner-a"}, BODY, declared=False)
    request.content = StalledStream()  # type: ignore[assignment]
    with pytest.raises(AuthenticationFailed):
        await authenticate(request, settings, scope="playback:write")
    assert request.content.reads == 0


async def test_a_body_that_never_arrives_times_out() -> None:
    request = FakeRequest({}, BODY, declared=False)
    request.content = StalledStream()  # type: ignore[assignment]
    with pytest.raises(BodyTimeout) as info:
        await read_body(request, 1000, timeout_s=0.05)
    assert info.value.response().status == 408


def test_one_key_filling_the_nonce_cache_never_refuses_another() -> None:
    cache = NonceCache(ttl_ms=600_000, capacity=3)
    now = 1_000_000
    for i in range(10):  # key a floods, with timestamps in the future
        cache.check_and_add("a", f"nonce-{i:04}", now + 300_000, now)
    assert cache.check_and_add("b", "nonce-b-01", now, now) is None
    assert cache.floor_ms("b") == 0 and cache.floor_ms("a") == now + 300_000


async def test_read_body_limits() -> None:
    assert await read_body(FakeRequest({}, b"x" * 10), 10) == b"x" * 10
    with pytest.raises(PayloadTooLarge):
        await read_body(FakeRequest({}, b"x" * 11), 10)
    with pytest.raises(PayloadTooLarge):  # chunked: no Content-Length, counted while streaming
        await read_body(FakeRequest({}, b"x" * 11, declared=False), 10)


def test_json_error_shapes() -> None:
    response = json_error(429, "slow down", reason="backpressure", retry_after_s=1.2, accepted=0)
    assert response.status == 429
    assert response.headers["Retry-After"] == "2"
    assert response.content_type == "application/json"
    assert orjson.loads(cast(bytes, response.body)) == {
        "error": "slow down",
        "reason": "backpressure",
        "retry_after_s": 2,
        "accepted": 0,
    }


async def test_require_hmac_decorates_view_methods(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.platform.http.auth.get_settings", lambda: settings)
    seen: list[str] = []

    class View:
        @require_hmac("playback:write")
        async def post(self, request: Any) -> web.Response:
            seen.append(request[KEY_ID_ATTRIBUTE])
            return web.Response(status=204)

    headers = sign_request("POST", PATH, BODY, "partner-a", SECRET)
    ok = await View().post(FakeRequest(headers, BODY))
    assert ok.status == 204 and seen == ["partner-a"]
    refused = await View().post(FakeRequest({**headers, HEADER_SIGNATURE: "0" * 64}, BODY))
    assert refused.status == 401 and seen == ["partner-a"]
