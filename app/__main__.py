"""``python -m app``: the same entry point as the ``avcc`` console script."""

from app.cli import main

main()
