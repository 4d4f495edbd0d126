"""One settings convention: every settings class of the product, listed, and how each is made.

Each is a ``*Settings`` class in its package's ``settings.py``: a frozen pydantic
``BaseSettings`` read from ``AVCC_*`` variables, every field documented (the README's tables are
generated from them), no variable read by two classes, and one cached getter in its module. No
product class is a ``*Config`` of thresholds the environment cannot set.
"""

from __future__ import annotations

import inspect

from pydantic_settings import BaseSettings

from tests.unit.product_modules import product_modules

#: Every settings class of the product (module, class): a new one is added here on purpose.
SETTINGS_CLASSES = {
    ("app.platform.settings", "Settings"),
    ("app.platform.lag.settings", "LagReadSettings"),
    ("app.lifecycle.review.settings", "ReviewSettings"),
    ("app.lifecycle.code.settings", "BulkSettings"),
    ("app.playback.gateway.settings", "GatewaySettings"),
    ("app.playback.sink.settings", "SinkSettings"),
    ("app.playback.anomaly.settings", "AnomalyRuleSettings"),
    ("app.playback.anomaly.settings", "AnomalySettings"),
    ("app.ops.lag.settings", "LagSettings"),
    ("app.ops.console.settings", "ConsoleSettings"),
    ("app.ops.slo.settings", "SloSettings"),
    ("app.supervisor.settings", "SupervisorSettings"),
    ("app.servers.settings", "EmbeddedKafkaSettings"),
}


def _defined() -> dict[type, object]:
    """Every class the product defines -> its module."""
    return {
        cls: module
        for module in product_modules()
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__
    }


def test_every_settings_class_follows_the_convention() -> None:
    defined = _defined()
    settings = {cls: module for cls, module in defined.items() if issubclass(cls, BaseSettings)}
    assert {(cls.__module__, cls.__name__) for cls in settings} == SETTINGS_CLASSES
    variables: dict[str, str] = {}
    for cls, module in settings.items():
        where = f"{cls.__module__}.{cls.__name__}"
        assert cls.__name__.endswith("Settings") and cls.__module__.endswith(".settings"), where
        assert cls.model_config.get("frozen") is True, f"{where} is not frozen"
        prefix = str(cls.model_config.get("env_prefix", ""))
        assert prefix.startswith("AVCC_"), f"{where} reads {prefix!r}"
        getters = [
            name
            for name, value in vars(module).items()
            if callable(value)
            and hasattr(value, "cache_clear")
            and getattr(value, "__wrapped__", None) is cls
        ]
        assert len(getters) == 1, f"{where} has {getters or 'no'} cached getter(s), wants one"
        assert getters[0] == "get_" + "".join(
            f"_{c.lower()}" if c.isupper() else c for c in cls.__name__
        ).lstrip("_")
        for name, field in cls.model_fields.items():
            assert field.description, f"{where}.{name} is not documented"
            variable = f"{prefix}{name}".upper()
            assert variable not in variables, f"{variable} is read by {variables.get(variable)} and {where}"
            variables[variable] = where


def test_no_product_class_is_a_config_of_its_own() -> None:
    configs = sorted(
        f"{cls.__module__}.{cls.__name__}" for cls in _defined() if cls.__name__.endswith("Config")
    )
    assert configs == [], "settings are *Settings classes in a settings.py (see the module docstring)"
