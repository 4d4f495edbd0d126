"""``python -m app.contract_docs [--check]``: regenerate or check the published contracts."""

from __future__ import annotations

import sys

from app.contract_docs.generate import main

sys.exit(main())
