"""One error tree: every exception class the product defines derives from ``AvccError``.

The test walks every module of the product packages (``agents``, ``tables``, ``app``,
``schemas``), so a new error class outside the tree fails here, naming it.
"""

from __future__ import annotations

import inspect

from app.platform.errors import AvccError
from tests.unit.product_modules import product_modules


def test_every_error_the_product_defines_derives_from_avcc_error() -> None:
    defined = [
        cls
        for module in product_modules()
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and issubclass(cls, BaseException)
    ]
    outside = sorted(
        f"{cls.__module__}.{cls.__qualname__}" for cls in defined if not issubclass(cls, AvccError)
    )
    assert len(defined) > 30, "the walk found the product's errors"
    assert outside == [], f"errors outside the AvccError tree: {outside}"
