"""Connection URLs made fit for messages and logs: the password replaced by ``***``.

A URL setting such as ``AVCC_CLICKHOUSE_URL=clickhouse://user:secret@host/db`` ends up in error
messages (a malformed one is quoted back to say what is wrong) and banners; the secret must not.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_url"]

MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part masked (anything unparsable whose
    authority has an ``@`` loses the whole user part)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # e.g. an unbalanced "[" in the host: mask the user part blindly
        scheme, sep, rest = url.partition("://")
        authority, slash, path = rest.partition("/")
        if "@" not in authority:
            return url
        return f"{scheme}{sep}{MASK}@{authority.rpartition('@')[2]}{slash}{path}"
    if password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{name}:{MASK}@{host}"))
