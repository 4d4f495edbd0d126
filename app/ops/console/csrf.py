"""Per-operator form tokens of the console's state-changing forms (CSRF protection).

The console already refuses POSTs whose ``Origin``/``Sec-Fetch-Site`` name another site. A token
adds a second, browser-independent check: every form carries ``issued_ms.hmac(secret, operator
\\n issued_ms)``, so a page of another site - which cannot read the console's pages - cannot
forge one, and a token of one operator is useless to another. Basic-auth credentials are sent
by the browser on cross-site requests regardless of cookies' SameSite, so the token (not a
cookie) is what binds a POST to a page the operator actually loaded.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

__all__ = ["FormTokens"]


class FormTokens:
    """Issues and checks form tokens bound to an operator name, valid for ``ttl_s``."""

    def __init__(
        self, secret: bytes | None = None, ttl_s: int = 3600, clock: Callable[[], float] = time.time
    ) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self.ttl_s = ttl_s
        self._clock = clock

    def _mac(self, operator: str, issued_ms: int) -> str:
        message = f"{operator}\n{issued_ms}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def issue(self, operator: str) -> str:
        """A fresh token for ``operator``."""
        issued_ms = int(self._clock() * 1000)
        return f"{issued_ms}.{self._mac(operator, issued_ms)}"

    def valid(self, operator: str, token: str | None) -> bool:
        """Whether ``token`` was issued to ``operator`` by this console within ``ttl_s``."""
        if not token or "." not in token:
            return False
        stamp, mac = token.split(".", 1)
        if not stamp.isdigit():
            return False
        issued_ms = int(stamp)
        age_ms = self._clock() * 1000 - issued_ms
        if age_ms < -60_000 or age_ms > self.ttl_s * 1000:
            return False
        return hmac.compare_digest(mac, self._mac(operator, issued_ms))
