"""``python -m scripts.docgen [--check]``: rewrite the generated blocks, or list the stale ones."""

from __future__ import annotations

import argparse
import sys

from scripts.docgen import BLOCKS
from scripts.docgen.blocks import refresh, stale


def main() -> int:
    """Rewrite (or with ``--check`` only list) the blocks that differ from their renderers."""
    parser = argparse.ArgumentParser(prog="python -m scripts.docgen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="list stale blocks, exit 1 if any")
    args = parser.parse_args()
    found = stale(BLOCKS) if args.check else refresh(BLOCKS)
    for block in found:
        print(f"{'stale' if args.check else 'rewrote'}: {block.page} ({block.name})")
    return 1 if args.check and found else 0


sys.exit(main())
