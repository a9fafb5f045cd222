"""Reports of a run directory: learning curves as PNG and a Markdown summary (``rlzoo plot RUN_DIR``).

:func:`plot_run` reads what every runner writes into its run directory (``metrics.jsonl``,
``config.yaml``, ``plugins.json``) and writes, under ``RUN_DIR/plots/``:

- one PNG per panel whose metrics exist (reward and accuracy, validation accuracy per data source,
  response length and clip ratio, policy statistics, idle ratios and queue, throughput, time per
  phase), and ``overview.png`` with every panel on one page;
- ``summary.md``: config highlights, plugins, first / final / best value of the key metrics, the
  timing breakdown per phase, and the PNGs.

Panels are chosen by metric *names* (verl's, which :mod:`rlzoo.metrics` keeps), never by runner:
a panel without any of its keys in the file is skipped, so a sync run simply has no idle-ratio
panel. matplotlib is imported lazily with the Agg backend (no display needed).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlzoo.errors import RlzooError
from rlzoo.metrics import read_metrics

__all__ = ["PANELS", "Panel", "ema", "plot_run", "plot_runs", "rolling_mean", "series", "summarize_run"]

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


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def metric_keys(records: Records) -> list[str]:
    """Every key with at least one numeric value, in first-seen order (``step``/``time`` excluded)."""
    seen: dict[str, None] = {}
    for r in records:
        for k, v in r.items():
            if k not in ("step", "time") and _numeric(v):
                seen.setdefault(k, None)
    return list(seen)


def match(keys: Iterable[str], patterns: Sequence[str], exclude: Sequence[str] = ()) -> list[str]:
    """Keys matching any pattern, in pattern order (a key appears once)."""
    keys = list(keys)
    out: dict[str, None] = {}
    for pat in patterns:
        for k in keys:
            if fnmatch.fnmatchcase(k, pat) and not any(fnmatch.fnmatchcase(k, e) for e in exclude):
                out.setdefault(k, None)
    return list(out)


def series(records: Records, key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of one metric over the records that have a finite value for it.

    A step logged twice (a resumed run repeats the steps after its last checkpoint) keeps its
    last value.
    """
    by_step: dict[int, float] = {}
    for r in records:
        v = r.get(key)
        if _numeric(v) and "step" in r:
            by_step[int(r["step"])] = float(v)  # type: ignore[arg-type]
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


# ---------------------------------------------------------------------------------------------
# smoothing
# ---------------------------------------------------------------------------------------------
#: series shorter than this are drawn as they are (with markers): nothing to smooth
MIN_POINTS_TO_SMOOTH = 30


def auto_smooth(n: int) -> float:
    """The EMA weight for a series of ``n`` points: none below 30 points, then about a 10-point
    window (weight 1 - 10 / n), at most 0.95 (a ~20-step window) for long runs."""
    if n < MIN_POINTS_TO_SMOOTH:
        return 0.0
    return min(0.95, max(0.0, 1.0 - 10.0 / n))


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Debiased exponential moving average (as TensorBoard's smoothing): ``weight`` in [0, 1)."""
    if not 0.0 <= weight < 1.0:
        raise RlzooError(f"smoothing weight must be in [0, 1), got {weight}")
    out, acc = [], 0.0
    for i, v in enumerate(values, start=1):
        acc = acc * weight + (1.0 - weight) * v
        out.append(acc / (1.0 - weight**i) if weight > 0 else v)
    return out


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def rolling_window(n: int) -> int:
    """The rolling-mean window for ``n`` points: ~1/40 of the run, at least 5 steps."""
    return max(5, n // 40)


def smoothed(panel: Panel, values: Sequence[float], weight: float | None) -> list[float] | None:
    """The smoothed series drawn over the faint raw one; None when the series is left raw."""
    n = len(values)
    if n < MIN_POINTS_TO_SMOOTH or weight == 0.0:
        return None
    if panel.smoothing == "rolling":
        return rolling_mean(values, rolling_window(n))
    return ema(values, auto_smooth(n) if weight is None else weight)


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------
def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise RlzooError(
            "rlzoo plot needs matplotlib, which is not installed: pip install rlzoo[plot] (or: pip install matplotlib)"
        ) from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _label(key: str) -> str:
    return key.removeprefix("timing_s/")


#: line styles and markers given to the series of one panel, in order: two series never look alike
STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


@dataclass(frozen=True)
class RunData:
    """One run's records and the label its curves carry when several runs are overlaid."""

    label: str
    records: Records
    run_dir: Path | None = None


def _style(i: int, n_points: int, n_lines: int) -> dict[str, Any]:
    """Line style of the ``i``-th series of a panel: its own dash pattern and marker, markers spaced
    out and offset per series so that equal series stay visible on top of each other."""
    every = max(1, n_points // 10)
    offset = (i * every) // max(1, n_lines)
    return {
        "linestyle": STYLES[i % len(STYLES)],
        "marker": MARKERS[i % len(MARKERS)],
        "markevery": (offset, every) if n_points > 1 else None,
        "markersize": 4,
    }


def _same_as(xs: list[int], ys: list[float], drawn: dict[str, tuple[list[int], list[float]]]) -> str | None:
    """The key of an already drawn series equal to ``(xs, ys)``, if any."""
    for k, (x0, y0) in drawn.items():
        if x0 == xs and len(y0) == len(ys) and all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(y0, ys)):
            return k
    return None


def _legend(ax: Any, handles: list[Any], labels: list[str]) -> None:
    """The legend under the plot area, never over the data."""
    if not handles:
        return
    ncol = 1 if max(map(len, labels)) > 40 else (2 if len(labels) > 1 else 1)
    if len(labels) > 4 and max(map(len, labels)) <= 24:
        ncol = 3
    ax.legend(
        handles,
        labels,
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=ncol,
        frameon=False,
    )


def _draw(ax: Any, panel: Panel, runs: Sequence[RunData], smooth: float | None = None) -> bool:
    """Draw ``panel`` for ``runs`` on ``ax`` (one colour per run when several, one dash pattern
    and marker per metric); False when none of its keys has data."""
    keys_of = [metric_keys(r.records) for r in runs]
    if len(runs) > 1 and panel.overlay_keys:
        panel = dataclasses.replace(panel, keys=panel.overlay_keys, exclude=(), stacked=False)
    left = [match(k, panel.keys, panel.exclude) for k in keys_of]
    right = [match(k, panel.right_keys, panel.exclude) for k in keys_of]
    if not any(left) and not any(right):
        return False
    ax.set_title(panel.title, fontsize=10)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    if panel.histogram:
        _draw_histogram(ax, panel, runs, left)
        return True
    ax.set_xlabel("step", fontsize=8)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    multi = len(runs) > 1
    if panel.stacked and not multi:
        _draw_stacked(ax, panel, runs[0], left[0], smooth)
        return True
    handles: list[Any] = []
    labels: list[str] = []
    all_left = list(dict.fromkeys(k for ks in left for k in ks))
    all_right = list(dict.fromkeys(k for ks in right for k in ks))
    ax2 = ax.twinx() if all_right else None
    if ax2 is not None:
        ax2.tick_params(labelsize=8)
        ax2.set_ylabel(panel.right_label, fontsize=8)
    n_lines = len(all_left) + len(all_right)
    for r_i, (run, lk, rk) in enumerate(zip(runs, left, right)):
        drawn: dict[str, tuple[list[int], list[float]]] = {}
        sides: list[tuple[str, list[str], Any]] = [("left", lk, ax)]
        if ax2 is not None:
            sides.append(("right", rk, ax2))
        for side, keys, axis in sides:
            for k in keys:
                x, y = series(run.records, k)
                if not x:
                    continue
                m_i = all_left.index(k) if side == "left" else len(all_left) + all_right.index(k)
                color = f"C{r_i}" if multi else f"C{m_i}"
                style = _style(m_i, len(x), n_lines)
                twin = _same_as(x, y, drawn)
                drawn[k] = (x, y)
                label = _label(k) if not multi else f"{run.label}: {_label(k)}"
                if twin is not None:
                    label += f" (= {_label(twin)})"
                smooth_y = smoothed(panel, y, smooth)
                if smooth_y is None:
                    (line,) = axis.plot(x, y, color=color, linewidth=1.5, **style)
                else:
                    axis.plot(x, y, color=color, linewidth=0.6, alpha=0.25)  # raw, faint behind
                    (line,) = axis.plot(x, smooth_y, color=color, linewidth=1.6, **style)
                handles.append(line)
                labels.append(label)
                if panel.band is not None and k == panel.keys[0] and not multi:
                    lo, hi = (dict(zip(*series(run.records, b))) for b in panel.band)
                    xs = [s for s in x if s in lo and s in hi]
                    if xs:
                        ylo, yhi = [lo[s] for s in xs], [hi[s] for s in xs]
                        ylo, yhi = smoothed(panel, ylo, smooth) or ylo, smoothed(panel, yhi, smooth) or yhi
                        band = ax.fill_between(xs, ylo, yhi, alpha=0.12, color=color, linewidth=0)
                        handles.append(band)
                        labels.append(f"{_label(k).rsplit('/', 1)[0]} min-max")
    if panel.unit_interval:
        ax.set_ylim(-0.02, 1.02)
    elif panel.zero_based:
        ax.set_ylim(bottom=0)
    if ax2 is not None and "ratio" in panel.right_label:
        ax2.set_ylim(-0.02, 1.02)
    smoothing_note = _smoothing_note(panel, runs, left + right, smooth)
    if smoothing_note:
        ax.text(
            0.99, 0.98, smoothing_note, transform=ax.transAxes, ha="right", va="top", fontsize=6, color="0.45"
        )
    _legend(ax, handles, labels)
    return True


def _smoothing_note(
    panel: Panel, runs: Sequence[RunData], keys: Sequence[list[str]], smooth: float | None
) -> str:
    n = max((len(series(r.records, k)[0]) for r, ks in zip(runs, keys) for k in ks), default=0)
    if n < MIN_POINTS_TO_SMOOTH or smooth == 0.0:
        return ""
    if panel.smoothing == "rolling":
        return f"rolling mean over {rolling_window(n)} steps; raw faint"
    return f"EMA {auto_smooth(n) if smooth is None else smooth:.2f}; raw faint"


def _draw_stacked(ax: Any, panel: Panel, run: RunData, keys: list[str], smooth: float | None) -> None:
    steps = sorted({s for k in keys for s in series(run.records, k)[0]})
    ys = []
    for k in keys:
        d = dict(zip(*series(run.records, k)))
        y = [d.get(s, 0.0) for s in steps]
        ys.append(smoothed(panel, y, smooth) or y)
    if steps:
        polys = ax.stackplot(steps, ys, alpha=0.85)
        _legend(ax, list(polys), [_label(k) for k in keys])
    note = _smoothing_note(panel, [run], [keys], smooth)
    if note:
        ax.text(
            0.99,
            0.98,
            note.replace("; raw faint", ""),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=6,
            color="0.45",
        )


def _draw_histogram(ax: Any, panel: Panel, runs: Sequence[RunData], keys: Sequence[list[str]]) -> None:
    """Staleness as a histogram: per trained sample (``summary.json`` of an async run) or, without
    it, per step of the first key (``staleness/max``); bars side by side for several runs."""
    bars_of: list[tuple[int, RunData, dict[int, float], str]] = []
    for i, (run, ks) in enumerate(zip(runs, keys)):
        hist = _staleness_histogram(run.run_dir)
        if hist:
            bars_of.append((i, run, {int(k): float(v) for k, v in hist.items()}, "per trained sample"))
        elif ks:
            counts: dict[int, float] = {}
            for v in series(run.records, ks[0])[1]:
                counts[round(v)] = counts.get(round(v), 0.0) + 1
            if counts:
                bars_of.append((i, run, counts, f"{_label(ks[0])} per step"))
    width = 0.8 / max(1, len(bars_of))
    handles, labels = [], []
    for j, (i, run, counts, what) in enumerate(bars_of):
        total = sum(counts.values())
        xs = sorted(counts)
        bars = ax.bar(
            [x - 0.4 + width * (j + 0.5) for x in xs],
            [counts[x] / total for x in xs],
            width=width,
            color=f"C{i}",
            alpha=0.85,
            hatch=("", "//", "..", "xx")[j % 4],
            edgecolor="white",
        )
        shares = [counts[x] / total for x in xs]
        ax.bar_label(bars, labels=[f"{100 * v:.1f}%" for v in shares], fontsize=7, padding=2)
        handles.append(bars)
        labels.append((f"{run.label}: " if len(runs) > 1 else "") + what)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("policy versions behind", fontsize=8)
    ax.set_ylabel("share", fontsize=8)
    ax.set_ylim(0, 1.02)
    _legend(ax, handles, labels)


def _staleness_histogram(run_dir: Path | None) -> Mapping[str, Any] | None:
    if run_dir is None:
        return None
    summary = _load_json(run_dir / "summary.json")
    hist = summary.get("staleness_histogram") if isinstance(summary, Mapping) else None
    return hist if isinstance(hist, Mapping) and hist else None


def _header(run_dir: Path) -> str:
    cfg = _load_yaml(run_dir / "config.yaml")
    name = (cfg.get("run") or {}).get("name") or run_dir.name
    recipe = cfg.get("recipe")
    return f"{name}" + (f" (recipe {recipe})" if recipe and recipe != name else "")


def _read_run(run_dir: Path) -> list[dict[str, Any]]:
    if not (run_dir / "metrics.jsonl").exists():
        hint = (
            " (is it a run directory? rlzoo train prints its path)"
            if run_dir.exists()
            else " (no such folder)"
        )
        raise RlzooError(f"{run_dir}/metrics.jsonl not found{hint}")
    records = read_metrics(run_dir)
    if not records:
        raise RlzooError(f"{run_dir}/metrics.jsonl has no records yet")
    return records


def _render(
    runs: Sequence[RunData], out: Path, title: str, subtitle: str, smooth: float | None
) -> tuple[list[Path], list[Panel]]:
    """One PNG per panel with data and ``overview.png`` (first in the list)."""
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    drawn: list[Panel] = []
    for panel in PANELS:
        fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110, layout="constrained")
        if _draw(ax, panel, runs, smooth):
            fig.suptitle(title, fontsize=8, color="0.4", x=0.99, ha="right")
            path = out / f"{panel.name}.png"
            fig.savefig(path)
            written.append(path)
            drawn.append(panel)
        plt.close(fig)
    if drawn:
        cols = 2 if len(drawn) > 1 else 1
        rows = math.ceil(len(drawn) / cols)
        fig, axes = plt.subplots(
            rows, cols, figsize=(7.5 * cols, 4.4 * rows), dpi=90, squeeze=False, layout="constrained"
        )
        for ax, panel in zip(axes.flat, drawn):
            _draw(ax, panel, runs, smooth)
        for ax in list(axes.flat)[len(drawn) :]:
            ax.axis("off")
        fig.suptitle(f"{title}: {subtitle}", fontsize=11)
        path = out / "overview.png"
        fig.savefig(path)
        plt.close(fig)
        written.insert(0, path)
    return written, drawn


def plot_run(
    run_dir: str | Path, out_dir: str | Path | None = None, *, smooth: float | None = None
) -> list[Path]:
    """Render ``run_dir``'s learning curves (PNG) and ``summary.md``; return the files written.

    Files go to ``out_dir`` (default ``run_dir/plots``): ``<panel>.png`` for each panel with data,
    ``overview.png`` (all of them on one page) and ``summary.md``. Long series are smoothed (EMA,
    ``smooth`` = its weight, default by length; idle ratios and the queue by a rolling mean) over
    their raw values drawn faint. Raises :class:`RlzooError` when the directory has no
    ``metrics.jsonl`` records, or matplotlib is not installed.
    """
    run_dir = Path(run_dir).expanduser()
    records = _read_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    written, _ = _render(
        [RunData(run_dir.name, records, run_dir)], out, _header(run_dir), str(run_dir), smooth
    )
    summary = out / "summary.md"
    summary.write_text(summarize_run(run_dir, records, images=[p.relative_to(out) for p in written]))
    written.append(summary)
    return written


def plot_runs(
    run_dirs: Sequence[str | Path], out_dir: str | Path | None = None, *, smooth: float | None = None
) -> list[Path]:
    """One run: :func:`plot_run`. Several: their curves overlaid (one colour per run) in
    ``out_dir`` (default ``FIRST_RUN/plots/compare``), with ``summary.md`` listing each run's
    key metrics."""
    dirs = [Path(d).expanduser() for d in run_dirs]
    if not dirs:
        raise RlzooError("rlzoo plot needs at least one run directory")
    if len(dirs) == 1:
        return plot_run(dirs[0], out_dir, smooth=smooth)
    labels = _run_labels(dirs)
    runs = [RunData(label, _read_run(d), d) for label, d in zip(labels, dirs)]
    out = Path(out_dir) if out_dir is not None else dirs[0] / "plots" / "compare"
    title = " vs ".join(labels)
    written, _ = _render(runs, out, title, f"{len(runs)} runs", smooth)
    lines = [f"# Comparison: {title}", ""]
    for run in runs:
        lines += [f"## {run.label}", "", f"Run directory: `{run.run_dir}`", ""]
        table = metric_table(run.records)
        if table:
            lines += [*_md_table(["metric", "first", "final", "best", "best at step"], table), ""]
    lines += ["## Curves", ""] + [f"![{p.stem}]({p.relative_to(out)})" for p in written] + [""]
    summary = out / "summary.md"
    summary.write_text("\n".join(lines))
    written.append(summary)
    return written


def _run_labels(dirs: Sequence[Path]) -> list[str]:
    """Short distinct names for overlaid runs: the folder names (parents added until distinct)."""
    labels = [d.name for d in dirs]
    if len(set(labels)) < len(labels):
        labels = [f"{d.parent.name}/{d.name}" for d in dirs]
    if len(set(labels)) < len(labels):
        labels = [f"{i + 1}: {lab}" for i, lab in enumerate(labels)]
    return labels


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------
def _load_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except Exception:
        return {}
    return data if isinstance(data, dict) else {}


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except Exception:
        return None


def _get(cfg: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = cfg
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _part(cfg: Mapping[str, Any], dotted: str, params: Sequence[str] = ()) -> str | None:
    """``name (p=v, ...)`` of a part selection in config.yaml (``{name, plugin, **params}``)."""
    sel = _get(cfg, dotted)
    if sel is None:
        return None
    if not isinstance(sel, Mapping):
        return str(sel)
    shown = [f"{p}={_fmt_value(sel[p])}" for p in params if p in sel]
    return f"{sel.get('name')}" + (f" ({', '.join(shown)})" if shown else "")


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v == 0 or 1e-3 <= abs(v) < 1e5:
        return f"{v:.4g}"
    return f"{v:.3e}"


def config_highlights(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(what, value)`` rows of the settings a reader of a run checks first."""
    rows: list[tuple[str, Callable[[], Any]]] = [
        ("recipe", lambda: cfg.get("recipe")),
        ("model", lambda: _get(cfg, "model.path")),
        ("runner", lambda: _part(cfg, "runner")),
        (
            "placement",
            lambda: _placement(cfg),
        ),
        ("train backend", lambda: _part(cfg, "trainer.backend", ("dtype", "lr", "fsdp_size", "offload"))),
        ("rollout backend", lambda: _part(cfg, "rollout.backend")),
        ("advantage", lambda: _part(cfg, "algorithm.advantage", ("norm_by_std", "gamma", "lam"))),
        ("policy loss", lambda: _part(cfg, "algorithm.policy_loss", ("clip_ratio_low", "clip_ratio_high"))),
        ("loss aggregation", lambda: _part(cfg, "algorithm.loss_agg")),
        ("KL loss", lambda: _kl(cfg)),
        ("sample filter", lambda: _part(cfg, "algorithm.sample_filter", ("max_num_gen_batches",))),
        (
            "reward",
            lambda: " + ".join(
                s
                for s in (
                    _part(cfg, "reward.manager", ("overlong_buffer_len", "penalty_factor")),
                    _part(cfg, "reward.scorer"),
                )
                if s
            ),
        ),
        ("responses per prompt (n)", lambda: _get(cfg, "rollout.n")),
        ("prompts per step", lambda: _get(cfg, "data.train_batch_size")),
        ("mini-batch (prompts)", lambda: _get(cfg, "trainer.ppo_mini_batch_size")),
        ("max prompt / response", lambda: _pair(cfg, "data.max_prompt_length", "data.max_response_length")),
        ("train files", lambda: ", ".join(map(str, _get(cfg, "data.train_files") or [])) or None),
        ("val files", lambda: ", ".join(map(str, _get(cfg, "data.val_files") or [])) or None),
        ("validation", lambda: _validation(cfg)),
        ("seed", lambda: _get(cfg, "run.seed")),
    ]
    out = []
    for what, fn in rows:
        v = fn()
        if v is not None and v != "":
            out.append((what, str(v)))
    return out


def _pair(cfg: Mapping[str, Any], a: str, b: str) -> str | None:
    va, vb = _get(cfg, a), _get(cfg, b)
    return None if va is None and vb is None else f"{va} / {vb}"


def _kl(cfg: Mapping[str, Any]) -> str | None:
    use = _get(cfg, "algorithm.use_kl_loss")
    if use is None:
        return None
    if not use:
        return "off"
    return f"{_part(cfg, 'algorithm.kl_loss')} x {_get(cfg, 'algorithm.kl_loss_coef')}"


def _placement(cfg: Mapping[str, Any]) -> str | None:
    p = _get(cfg, "placement")
    if not isinstance(p, Mapping):
        return None
    text = str(p.get("name"))
    if p.get("name") == "ray":

        def pool(k: str) -> str:
            q = p.get(k) or {}
            return f"{q.get('nnodes', 1)}x{q.get('n_gpus_per_node', 0)} GPU"

        text += (
            f", colocated on {pool('trainer')}"
            if p.get("colocate")
            else f", trainer {pool('trainer')} + rollout {pool('rollout')}"
        )
    return text


def _validation(cfg: Mapping[str, Any]) -> str | None:
    val = _get(cfg, "rollout.val")
    if not isinstance(val, Mapping):
        return None
    before = _get(cfg, "trainer.val_before_train")
    freq = _get(cfg, "trainer.test_freq")
    return f"n={val.get('n')}, temperature={val.get('temperature')}, every {freq} steps" + (
        ", before training" if before else ""
    )


def metric_table(records: Records) -> list[tuple[str, str, str, str, str]]:
    """``(metric, first, final, best, best step)`` for the summary's key metrics present in ``records``."""
    keys = metric_keys(records)
    rows = []
    done: set[str] = set()
    for pattern, better in SUMMARY_KEYS:
        for k in match(keys, [pattern], ("val/response_length/*",)):
            if k in done:
                continue
            done.add(k)
            steps, values = series(records, k)
            if not values:
                continue
            best, best_step = "-", "-"
            if better:
                i = max(range(len(values)), key=lambda j: values[j] if better == "max" else -values[j])
                best, best_step = _fmt(values[i]), str(steps[i])
            rows.append((k, _fmt(values[0]), _fmt(values[-1]), best, best_step))
    return rows


def timing_table(records: Records) -> tuple[list[tuple[str, str, str, str]], float | None]:
    """``(phase, mean s/step, total s, share of step time)`` rows, and the mean step time."""
    keys = match(metric_keys(records), ["timing_s/*"])
    _, step_values = series(records, "timing_s/step")
    step_total = sum(step_values)
    rows = []
    for k in keys:
        if k == "timing_s/step":
            continue
        _, values = series(records, k)
        if not values:
            continue
        total = sum(values)
        share = f"{100 * total / step_total:.1f}%" if step_total > 0 else "-"
        rows.append((_label(k), _fmt(total / len(values)), _fmt(total), share))
    rows.sort(key=lambda r: -float(r[2]) if r[2] != "-" else 0.0)
    mean_step = step_total / len(step_values) if step_values else None
    return rows, mean_step


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return lines


def summarize_run(run_dir: str | Path, records: Records | None = None, *, images: Sequence[Path] = ()) -> str:
    """The Markdown summary of a run directory (what ``summary.md`` holds)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir) if records is None else records
    cfg = _load_yaml(run_dir / "config.yaml")
    lines = [f"# Run summary: {_header(run_dir)}", "", f"Run directory: `{run_dir}`", ""]

    steps = [int(r["step"]) for r in records if "step" in r]
    times = [float(r["time"]) for r in records if _numeric(r.get("time"))]
    facts = [f"steps logged: {max(steps) if steps else 0}"]
    if len(times) > 1:
        facts.append(f"wall-clock (first to last record): {_duration(max(times) - min(times))}")
    summary = _load_json(run_dir / "summary.json")
    if isinstance(summary, Mapping) and summary.get("steps") is not None:
        facts.append(f"planned steps: {summary['steps']}")
    lines += ["- " + f for f in facts] + [""]

    if cfg:
        lines += ["## Config highlights", ""]
        lines += _md_table(["setting", "value"], config_highlights(cfg))
        lines += ["", "Full config: `config.yaml`.", ""]

    plugins = _load_json(run_dir / "plugins.json")
    if isinstance(plugins, Mapping) and isinstance(plugins.get("plugins"), list):
        used = _used_plugins(cfg)
        rows = []
        for p in plugins["plugins"]:
            if not isinstance(p, Mapping):
                continue
            name = str(p.get("name"))
            if p.get("builtin") and name not in used:
                continue
            rows.append(
                (
                    name,
                    str(p.get("version") or "-"),
                    "built-in" if p.get("builtin") else str(p.get("distribution") or p.get("source") or "-"),
                    str(p.get("status") or "-") + (f": {p['error']}" if p.get("error") else ""),
                )
            )
        lines += ["## Plugins", ""]
        if rows:
            lines += _md_table(["plugin", "version", "from", "status"], rows)
            lines += [
                "",
                "Built-in plugins are listed when a part of this run came from them; all are in `plugins.json`.",
            ]
        else:
            lines += ["No plugin recorded."]
        lines += [""]

    table = metric_table(records)
    if table:
        lines += ["## Metrics", ""]
        lines += _md_table(["metric", "first", "final", "best", "best at step"], table)
        lines += [""]

    timing, mean_step = timing_table(records)
    if timing:
        lines += ["## Time per phase", ""]
        if mean_step is not None:
            lines += [
                f"Mean step: {_fmt(mean_step)} s. Shares are of the summed step time (testing and checkpoints run outside it).",
                "",
            ]
        lines += _md_table(["phase", "mean s / step", "total s", "share of step time"], timing)
        lines += [""]

    if images:
        lines += ["## Curves", ""]
        lines += [f"![{Path(p).stem}]({p})" for p in images]
        lines += [""]
    return "\n".join(lines)


def _used_plugins(cfg: Mapping[str, Any]) -> set[str]:
    found: set[str] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, Mapping):
            if isinstance(obj.get("plugin"), str) and "name" in obj:
                found.add(obj["plugin"])
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    walk(cfg)
    return found


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    h, rem = divmod(round(seconds), 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h} h {m:02d} min"
    if m:
        return f"{m} min {s:02d} s"
    return f"{seconds:.1f} s"
