"""The published example events (``schemas/examples/<topic>.json``): the seed's examples, made valid.

Each file is a JSON array of AsyncAPI message examples ``{"name", "summary", "payload"}`` whose
``payload`` is a whole envelope. The unit tests use them as their valid events, and the AsyncAPI
document embeds them, so the examples a partner reads are the ones the tests check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import orjson

__all__ = ["EXAMPLES_DIR", "load_examples"]

#: ``schemas/examples`` of this checkout.
EXAMPLES_DIR: Final = Path(__file__).resolve().parents[2] / "schemas" / "examples"


def load_examples(directory: Path = EXAMPLES_DIR) -> dict[str, list[dict[str, Any]]]:
    """Topic -> its examples, in the files' order."""
    examples: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob("*.json")):
        items = orjson.loads(path.read_bytes())
        if not isinstance(items, list):
            raise ValueError(f"{path}: expected a JSON array of examples")
        examples[path.stem] = items
    return examples
