"""Service-level objectives: their settings, the rules they generate, and the console's report
(quantiles read off the buckets exactly as Prometheus's histogram_quantile reads them)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from pydantic import ValidationError

from app.ops.slo.report import histogram_quantile, level_reports
from app.ops.slo.rules import slo_rule_groups
from app.ops.slo.settings import SloSettings
from app.platform.metrics import TIME_TO_CODE_BUCKETS
from schemas.types import FinalLevel

BOUNDS = list(TIME_TO_CODE_BUCKETS)
EDGES = [*BOUNDS, float("inf")]


def cumulative(observed: dict[float, int]) -> list[int]:
    """Cumulative bucket counts of observations ``{seconds: how many}`` (``+Inf`` last)."""
    return [sum(n for seconds, n in observed.items() if seconds <= edge) for edge in EDGES]


def test_every_level_has_an_objective_whose_target_is_a_bucket_bound() -> None:
    objectives = SloSettings().levels()
    assert {o.level for o in objectives} == set(get_args(FinalLevel))
    assert [(o.level, o.target_s, o.objective, o.budget) for o in objectives] == [
        ("O", 5.0, 0.99, 0.01),
        ("G", 60.0, 0.99, 0.01),
        ("P", 60.0, 0.99, 0.01),
    ]
    with pytest.raises(ValidationError, match="bounds"):
        SloSettings(targets_s={"O": 6.0, "G": 60.0, "P": 60.0})
    with pytest.raises(ValidationError, match="every level"):
        SloSettings(targets_s={"O": 5.0})
    with pytest.raises(ValidationError, match="below 1"):
        SloSettings(objectives={"O": 0.99, "G": 1.0, "P": 0.99})


def test_objectives_and_thresholds_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AVCC_SLO_TARGETS_S", '{"O": 3, "G": 60, "P": 120}')
    monkeypatch.setenv("AVCC_SLO_OBJECTIVES", '{"O": 0.995, "G": 0.99, "P": 0.9}')
    monkeypatch.setenv("AVCC_SLO_HUMAN_WAIT_MAX_S", "7200")
    settings = SloSettings()
    groups = {g["name"]: g["rules"] for g in slo_rule_groups(settings)}
    sli = next(r for r in groups["avcc-time-to-code"] if "record" in r and r["labels"] == {"level": "O"})
    assert 'le="3.0"' in sli["expr"]
    fast = next(r for r in groups["avcc-time-to-code"] if "alert" in r and r["labels"].get("level") == "O")
    assert fast["expr"].endswith("> 0.072")  # 14.4 x 0.5 %
    waiting = next(r for r in groups["avcc-time-to-code"] if r.get("alert") == "AvccHumanReviewWaiting")
    assert waiting["expr"].endswith("> 7200") and "longer than 2h" in waiting["annotations"]["summary"]


def test_the_rules_select_buckets_as_the_client_library_writes_them() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("h", "h", buckets=TIME_TO_CODE_BUCKETS, registry=registry)
    histogram.observe(1)
    exposed = generate_latest(registry).decode()
    for objective in SloSettings().levels():
        assert f'le="{objective.target_s!r}"' in exposed


def test_quantiles_compliance_and_budget_of_a_level() -> None:
    window: dict[str, Any] = {
        "bounds": BOUNDS,
        "series": [
            {
                "level": "O",
                "outcome": "issued",
                "review": "ai",
                "buckets": cumulative({0.3: 90, 7.5: 8}),
                "sum": 0,
            },
            {
                "level": "O",
                "outcome": "chain_failed",
                "review": "ai",
                "buckets": cumulative({0.3: 2}),
                "sum": 0,
            },
            {"level": "O", "outcome": "issued", "review": "human", "buckets": cumulative({300: 5}), "sum": 0},
            {"level": "P", "outcome": "rejected", "review": "ai", "buckets": cumulative({1.0: 4}), "sum": 0},
        ],
        "stages": [
            {"level": "O", "stage": "code", "count": 100, "sum": 10.0},
            {"level": "O", "stage": "chain", "count": 98, "sum": 98 * 0.9},
            {"level": "O", "stage": "human_wait", "count": 5, "sum": 5000.0},
        ],
    }
    o_level, g_level, p_level = level_reports(window, SloSettings().levels())
    assert (o_level.answered, o_level.in_time) == (100, 90)  # late and failed are both misses
    assert o_level.compliance == 0.9
    assert o_level.budget_left == pytest.approx(1 - 10 / 1)  # 10 misses where 1 was allowed: -900 %
    assert o_level.p50_s == pytest.approx(0.2 + 0.1 * 50 / 92)
    assert o_level.p99_s == pytest.approx(5.0 + 2.5 * 7 / 8)
    assert o_level.slowest_stage == ("chain", pytest.approx(0.9))
    assert g_level.answered == 0 and g_level.compliance is None and g_level.p99_s is None
    assert (p_level.answered, p_level.in_time, p_level.budget_left) == (4, 4, 1.0)
    assert p_level.slowest_stage is None


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail("promtool is missing on this CI machine", pytrace=False)
        pytest.skip("promtool not installed")
    return found


@pytest.mark.parametrize(
    "observed",
    [{0.3: 7, 0.4: 2, 1.0: 1}, {0.1: 1}, {5.0: 3, 7.5: 1, 300.0: 96}, {400.0: 2}, {0.2: 1, 60.0: 99}],
)
def test_quantiles_are_what_prometheus_histogram_quantile_gives(
    observed: dict[float, int], tmp_path: Path
) -> None:
    """The same buckets fed to Prometheus (promtool's rule tests evaluate PromQL), compared to
    the bit: a dashboard and the console show one figure."""
    counts = cumulative(observed)
    labels = [repr(bound) for bound in BOUNDS] + ["+Inf"]
    series = [
        {"series": f'h_bucket{{le="{le}"}}', "values": f"{count}x2"}
        for le, count in zip(labels, counts, strict=True)
    ]
    checks = [
        {
            "expr": f"histogram_quantile({q}, h_bucket)",
            "eval_time": "1m",
            "exp_samples": [{"labels": "{}", "value": histogram_quantile(q, BOUNDS, counts)}],
        }
        for q in (0.5, 0.9, 0.99)
    ]
    case = {"tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}]}
    (tmp_path / "quantiles.test.yml").write_text(yaml.safe_dump(case))
    result = subprocess.run(
        [_promtool(), "test", "rules", str(tmp_path / "quantiles.test.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
