"""Consumer lag of every group: Burrow-style evaluation, the monitor and its pages (the reader is
:mod:`app.platform.lag`)."""
