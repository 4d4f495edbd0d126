"""One error tree: every exception class the product defines derives from ``AvccError``.

The test walks every module of the product packages (``agents``, ``tables``, ``app``,
``schemas``), so a new error class outside the tree fails here, naming it.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

from app.platform.errors import AvccError

PRODUCT_PACKAGES = ("schemas", "app", "tables", "agents")


def product_modules() -> list[ModuleType]:
    """Every importable module of the product packages (``__main__`` modules left out)."""
    modules: list[ModuleType] = []
    for name in PRODUCT_PACKAGES:
        package = importlib.import_module(name)
        modules.append(package)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            if info.name.rsplit(".", 1)[-1] != "__main__":
                modules.append(importlib.import_module(info.name))
    return modules


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
