"""The panels of ``rlzoo plot``: which metric keys (glob patterns) each chart draws, and the key
metrics ``summary.md`` tabulates. Panels are chosen by metric *names*, never by runner."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Records = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Panel:
    """One chart: the metric keys (glob patterns) on its left axis and, optionally, its right axis."""

    name: str  # file stem
    title: str
    keys: tuple[str, ...]
    ylabel: str = ""
    right_keys: tuple[str, ...] = ()
    right_label: str = ""
    #: band between these two keys' values around the first left line (e.g. score min / max)
    band: tuple[str, str] | None = None
    stacked: bool = False  # stacked area (time per phase)
    exclude: tuple[str, ...] = field(default_factory=tuple)
    #: how a long noisy series is smoothed: "ema" (exponential moving average) or "rolling" (mean)
    smoothing: str = "ema"
    #: a histogram instead of curves (staleness: how many samples trained how many versions late)
    histogram: bool = False
    #: the left axis holds fractions: keep it on [0, 1]
    unit_interval: bool = False
    #: the left axis starts at 0 (counts, ratios that stay small)
    zero_based: bool = False
    #: keys drawn instead of ``keys`` when several runs are overlaid (a stack per run cannot be)
    overlay_keys: tuple[str, ...] = ()


PANELS: tuple[Panel, ...] = (
    Panel(
        "reward",
        "Reward (training batches)",
        ("critic/score/mean", "critic/acc/mean"),
        "per response",
        band=("critic/score/min", "critic/score/max"),
    ),
    Panel(
        "validation",
        "Validation accuracy",
        ("val/*@*", "val/mean"),
        "accuracy",
        exclude=("val/response_length/*",),
    ),
    Panel(
        "response_length",
        "Response length",
        ("response_length/mean", "response_length/max", "val/response_length/mean"),
        "tokens",
    ),
    Panel(
        "clip_ratio",
        "Responses cut off by the length limit (no EOS)",
        ("response_length/clip_ratio",),
        "share of responses",
        zero_based=True,
    ),
    Panel(
        "policy",
        "Policy update",
        ("actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/pg_clipfrac_lower"),
        "",
        right_keys=("actor/entropy",),
        right_label="entropy",
    ),
    Panel(
        "idle",
        "Idle ratios (rolling mean)",
        (
            "trainer/idle_ratio",
            "rollouter/idle_ratio",
            "rollout/idle_ratio",
            "*/idle_ratio",
            "perf/overhead_frac",
            "staleness/stale_ratio",
        ),
        "fraction of wall-clock",
        smoothing="rolling",
        unit_interval=True,
    ),
    Panel(
        "queue",
        "Sample queue (rolling mean)",
        ("queue/size", "queue/in_flight"),
        "samples",
        smoothing="rolling",
    ),
    Panel(
        "staleness",
        "Staleness of trained samples",
        ("staleness/max", "staleness/mean"),
        "share of steps",
        histogram=True,
    ),
    Panel(
        "throughput",
        "Throughput",
        (
            "perf/throughput",
            "perf/trainer_tokens_per_s",
            "perf/rollouter_tokens_per_s",
            "perf/*tokens_per_gpu*",
        ),
        "tokens / s",
    ),
    Panel(
        "timing",
        "Time per phase",
        ("timing_s/*",),
        "seconds per step",
        stacked=True,
        exclude=("timing_s/step",),
        overlay_keys=("timing_s/step", "timing_s/gen", "timing_s/update_actor"),
    ),
)

#: metrics of the summary table: (key pattern, better) — better is "max", "min" or "" (no best)
SUMMARY_KEYS: tuple[tuple[str, str], ...] = (
    ("val/mean", "max"),
    ("val/*@*", "max"),
    ("critic/score/mean", "max"),
    ("critic/acc/mean", "max"),
    ("response_length/mean", ""),
    ("response_length/clip_ratio", "min"),
    ("actor/entropy", ""),
    ("actor/pg_clipfrac", ""),
    ("trainer/idle_ratio", "min"),
    ("perf/throughput", "max"),
    ("timing_s/step", "min"),
)
