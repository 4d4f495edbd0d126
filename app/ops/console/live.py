"""The console's one script (``live.js``, beside this module) and the view serving it.

The lag page updates its numbers in place with it (:func:`app.ops.lag.pages.render_lag_html`).
The script is served by the ops worker itself, so the page's Content-Security-Policy allows
same-origin scripts (:data:`~app.platform.http.headers.LIVE_PAGE_POLICY`) and nothing else: no
inline script, no third-party code, nothing for ``make run`` to install.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import faust

__all__ = ["LIVE_SCRIPT", "LIVE_SCRIPT_ROUTE", "install_live_script"]

LIVE_SCRIPT_ROUTE: Final = "/console/live.js"
#: The script's bytes, read once (it ships with the package: ``setup.cfg`` package data).
LIVE_SCRIPT: Final = (Path(__file__).parent / "live.js").read_bytes()


def install_live_script(app: faust.App) -> None:
    """Serve :data:`LIVE_SCRIPT` at :data:`LIVE_SCRIPT_ROUTE` (behind the operator login, like
    every console path: the browser sends the login it already has)."""

    async def live_script(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.bytes(LIVE_SCRIPT, content_type="text/javascript")

    app.page(LIVE_SCRIPT_ROUTE, name="avcc_console_live_script")(live_script)
