"""Prometheus rules generated from the objectives: the SLIs, multiwindow burn-rate alerts per level,
and the wait for a person (``deploy/render.py`` writes them into the alert rules).

The SLI of a level is the share of its records no person decided (``review="ai"``) whose final
answer was good (:data:`~app.ops.slo.settings.GOOD_OUTCOMES`) and in time (``le`` = the target),
over 5 min, 30 min, 1 h and 6 h (recorded as ``avcc:time_to_code:error_ratio_rate<window>``).
Alerts follow the Google SRE workbook's multiwindow, multi-burn-rate pattern: the fast alert fires
while both the 1 h and the 5 min error ratios burn the budget at ``fast_burn_rate`` or more, the
slow one at ``slow_burn_rate`` over 6 h and 30 min; the short window lets an alert stop soon
after the burning does. Each names the level's slowest stage over its short window, the one with
the longest mean (``avcc:time_to_code_stage_seconds:mean<window>``), the wait for a person aside
(it has its own alert).

The recorded SLIs and the alerts reading them are one rule group: Prometheus runs the rules of a
group in order but groups independently, so an alert in another group could judge a ratio one
evaluation old (promtool's unit tests even order groups at random).
"""

from __future__ import annotations

from typing import Any, Final

from app.ops.slo.settings import GOOD_OUTCOMES, LevelObjective, SloSettings
from app.platform.metrics import NEED_HUMAN_OLDEST, REVIEW_AI, TIME_TO_CODE, TIME_TO_CODE_STAGE

__all__ = ["ERROR_RATIO", "STAGE_MEAN", "slo_rule_groups"]

#: Recorded error ratio of a level over a window (``{window}``: 5m, 30m, 1h, 6h).
ERROR_RATIO: Final = "avcc:time_to_code:error_ratio_rate{window}"
#: Recorded mean seconds per level and stage over a window.
STAGE_MEAN: Final = "avcc:time_to_code_stage_seconds:mean{window}"
#: (name, severity, long window, short window, which burn rate) of the two alerts per level.
_BURNS: Final = (
    ("AvccTimeToCodeFastBurn", "P1", "1h", "5m", "fast_burn_rate"),
    ("AvccTimeToCodeSlowBurn", "P2", "6h", "30m", "slow_burn_rate"),
)
#: Windows the error ratios are recorded over (the alerts' long and short ones).
_WINDOWS: Final = ("5m", "30m", "1h", "6h")
_HISTOGRAM: Final = next(iter(TIME_TO_CODE.describe())).name
_STAGES: Final = next(iter(TIME_TO_CODE_STAGE.describe())).name
_RECOMMENDATION = (
    "look at the stage named: chain = the chain backend (ledger node or EVM node: block interval, "
    "confirmations) and the chain group's batches; review = the review group's lag and replicas; "
    "code = the code group's lag and batch times (avcc_batch_seconds); then the console's overview"
)


def _number(value: float) -> str:
    return f"{value:g}"


def _duration(seconds: float) -> str:
    """Prometheus's spelling of a duration (``1h``, ``30m``, ``45s``)."""
    whole = int(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole == seconds and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{_number(seconds)}s"


def _error_ratio(objective: LevelObjective, window: str) -> str:
    """1 - in-time good answers / all answers of the level's records no person decided."""
    chosen = f'level="{objective.level}", review="{REVIEW_AI}"'
    # le is the bound as the client library writes it (5.0): float's repr for these bounds
    good = (
        f'{_HISTOGRAM}_bucket{{{chosen}, outcome=~"{"|".join(GOOD_OUTCOMES)}", le="{objective.target_s!r}"}}'
    )
    total = f"{_HISTOGRAM}_count{{{chosen}}}"
    # no good answer at all is a ratio of 1, not a missing one
    return f"1 - ((sum(rate({good}[{window}])) or vector(0)) / sum(rate({total}[{window}])))"


def _slowest_stage(level: str, window: str) -> str:
    """Template text naming the level's slowest stage over ``window`` (queried when it fires)."""
    query = f'topk(1, {STAGE_MEAN.format(window=window)}{{level="{level}", stage!="human_wait"}})'
    quoted = query.replace('"', '\\"')
    found = (
        f'the slowest stage over {window} is {{{{ label "stage" . }}}} '
        "(mean {{ value . | humanizeDuration }})"
    )
    return (
        f'{{{{ with query "{quoted}" }}}}{{{{ with first . }}}}{found}{{{{ end }}}}'
        f"{{{{ else }}}}no stage is known over {window}{{{{ end }}}}"
    )


def _burn_alert(objective: LevelObjective, settings: SloSettings, burn: tuple[str, ...]) -> dict[str, Any]:
    name, severity, long, short, rate_field = burn
    rate = float(getattr(settings, rate_field))
    threshold = _number(rate * objective.budget)
    level, target = objective.level, _number(objective.target_s)
    over_long, over_short = (f'{ERROR_RATIO.format(window=w)}{{level="{level}"}}' for w in (long, short))
    return {
        "alert": name,
        "expr": f"{over_long} > {threshold} and {over_short} > {threshold}",
        "labels": {"severity": severity, "service": "avcc", "level": level},
        "annotations": {
            "summary": f"{level}-level works miss their time to code ({target}s): the error budget "
            f"burns {_number(rate)}x too fast",
            "description": f"{{{{ $value | humanizePercentage }}}} of {level}-level answers over {long} "
            f"took longer than {target}s or failed (objective: {_number(objective.objective * 100)}% "
            f"within {target}s); {_slowest_stage(level, short)}",
            "recommendation": _RECOMMENDATION,
        },
    }


def slo_rule_groups(settings: SloSettings) -> list[dict[str, Any]]:
    """The rule groups: the SLIs and stage means recorded, then the alerts."""
    recorded: list[dict[str, Any]] = []
    for objective in settings.levels():
        recorded.extend(
            {
                "record": ERROR_RATIO.format(window=window),
                "expr": _error_ratio(objective, window),
                "labels": {"level": objective.level},
            }
            for window in _WINDOWS
        )
    for window in (short for *_, short, _ in _BURNS):
        by = "sum by (level, stage)"
        recorded.append(
            {
                "record": STAGE_MEAN.format(window=window),
                "expr": f"{by} (rate({_STAGES}_sum[{window}])) / {by} (rate({_STAGES}_count[{window}]))",
            }
        )
    alerts = [_burn_alert(o, settings, burn) for burn in _BURNS for o in settings.levels()]
    limit = _duration(settings.human_wait_max_s)
    alerts.append(
        {
            "alert": "AvccHumanReviewWaiting",
            "expr": f"time() - min({NEED_HUMAN_OLDEST.name}) > {_number(settings.human_wait_max_s)}",
            "labels": {"severity": "P2", "service": "avcc", "stage": "human_wait"},
            "annotations": {
                "summary": f"a work has waited for a person longer than {limit}",
                "description": "the oldest need_human work has waited {{ $value | humanizeDuration }} "
                f"for a reviewer (at most {limit})",
                "recommendation": "open the review workbench (console /review, oldest first) and decide "
                "it, or add reviewers",
            },
        }
    )
    return [{"name": "avcc-time-to-code", "rules": [*recorded, *alerts]}]
