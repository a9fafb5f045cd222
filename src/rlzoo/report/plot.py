"""Drawing the panels with matplotlib (Agg backend, imported lazily): one PNG per panel with data,
``overview.png``, and the entry points :func:`plot_run` / :func:`plot_runs`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.report.data import (
    MIN_POINTS_TO_SMOOTH,
    _label,
    auto_smooth,
    match,
    metric_keys,
    rolling_window,
    series,
    smoothed,
)
from rlzoo.report.metrics import read_metrics
from rlzoo.report.panels import PANELS, Panel, Records
from rlzoo.report.summary import _header, _load_json, _md_table, metric_table, summarize_run


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
    common_n = _longest(runs, [lk + rk for lk, rk in zip(left, right)])
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
                smooth_y = smoothed(panel, y, smooth, common_n)  # one window for every run drawn
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
                        ylo = smoothed(panel, ylo, smooth, common_n) or ylo
                        yhi = smoothed(panel, yhi, smooth, common_n) or yhi
                        band = ax.fill_between(xs, ylo, yhi, alpha=0.12, color=color, linewidth=0)
                        handles.append(band)
                        labels.append(f"{_label(k).rsplit('/', 1)[0]} min-max")
    if panel.unit_interval:
        ax.set_ylim(-0.02, 1.02)
    elif panel.zero_based:
        ax.set_ylim(bottom=0)
    if ax2 is not None and "ratio" in panel.right_label:
        ax2.set_ylim(-0.02, 1.02)
    smoothing_note = _smoothing_note(panel, runs, [lk + rk for lk, rk in zip(left, right)], smooth)
    if smoothing_note:
        ax.text(
            0.99, 0.98, smoothing_note, transform=ax.transAxes, ha="right", va="top", fontsize=6, color="0.45"
        )
    _legend(ax, handles, labels)
    return True


def _longest(runs: Sequence[RunData], keys: Sequence[list[str]]) -> int:
    """The longest series of ``keys`` over ``runs`` (``keys[i]``: run i's keys)."""
    return max((len(series(r.records, k)[0]) for r, ks in zip(runs, keys) for k in ks), default=0)


def _smoothing_note(
    panel: Panel, runs: Sequence[RunData], keys: Sequence[list[str]], smooth: float | None
) -> str:
    n = _longest(runs, keys)
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
