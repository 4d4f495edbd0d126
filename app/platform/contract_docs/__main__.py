"""``python -m app.platform.contract_docs [--check]``: regenerate or check the published contracts."""

from __future__ import annotations

import sys

from app.platform.contract_docs.generate import main

sys.exit(main())
