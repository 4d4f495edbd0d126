"""The modules of the product packages, for tests that hold a convention over all of them."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

__all__ = ["PRODUCT_PACKAGES", "product_modules"]

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
