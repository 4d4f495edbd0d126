"""The signing key of the EVM backend: read from ``AVCC_CHAIN_KEY_FILE``, or created for dev."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from app.platform.errors import ConfigurationError
from app.platform.settings import Settings

__all__ = ["create_key_file", "parse_key", "read_key"]


def parse_key(text: str) -> str:
    """A hex private key (``0x`` optional, surrounding whitespace ignored) as ``0x`` + 64 hex."""
    body = text.strip().removeprefix("0x")
    if len(body) != 64 or any(c not in "0123456789abcdefABCDEF" for c in body):
        raise ConfigurationError("the chain key file must hold one hex private key (64 hex digits)")
    return "0x" + body.lower()


def read_key(settings: Settings) -> str:
    """The private key in ``AVCC_CHAIN_KEY_FILE`` (``ConfigurationError`` when unset or unreadable)."""
    if settings.chain_key_file is None:
        raise ConfigurationError("AVCC_CHAIN_KEY_FILE must name the signing key file of the EVM backend")
    try:
        return parse_key(settings.chain_key_file.read_text())
    except OSError as exc:
        raise ConfigurationError(f"cannot read AVCC_CHAIN_KEY_FILE {settings.chain_key_file}: {exc}") from exc


def create_key_file(path: Path) -> str:
    """Write a fresh random key to ``path`` (mode 0600) unless it exists; return the key."""
    if path.exists():
        return parse_key(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    key = "0x" + secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key
