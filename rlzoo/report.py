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

import fnmatch
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlzoo.errors import RlzooError
from rlzoo.metrics import read_metrics

__all__ = ["PANELS", "Panel", "plot_run", "series", "summarize_run"]

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
        right_keys=("response_length/clip_ratio",),
        right_label="clip ratio (hit max length)",
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
        "Idle ratios and queue",
        (
            "trainer/idle_ratio",
            "rollout/idle_ratio",
            "*/idle_ratio",
            "perf/overhead_frac",
            "staleness/stale_ratio",
        ),
        "fraction of wall-clock",
        right_keys=("queue/size", "queue/in_flight"),
        right_label="samples",
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


def _draw(ax: Any, panel: Panel, records: Records, keys: list[str]) -> bool:
    """Draw ``panel`` on ``ax``; False when none of its keys has data."""
    left = match(keys, panel.keys, panel.exclude)
    right = match(keys, panel.right_keys, panel.exclude)
    if not left and not right:
        return False
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.stacked:
        steps = sorted({s for k in left for s in series(records, k)[0]})
        if steps:
            ys = []
            for k in left:
                d = dict(zip(*series(records, k)))
                ys.append([d.get(s, 0.0) for s in steps])
            ax.stackplot(steps, ys, labels=[_label(k) for k in left], alpha=0.85)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.legend(fontsize=7, loc="upper left", ncol=2 if len(left) > 4 else 1)
        return True
    lines = []
    for i, k in enumerate(left):
        x, y = series(records, k)
        marker = "o" if len(x) <= 30 else None
        (line,) = ax.plot(x, y, marker=marker, markersize=3, linewidth=1.5, label=_label(k))
        lines.append(line)
        if i == 0 and panel.band is not None:
            lo, hi = (dict(zip(*series(records, b))) for b in panel.band)
            xs = [s for s in x if s in lo and s in hi]
            if xs:
                ax.fill_between(
                    xs,
                    [lo[s] for s in xs],
                    [hi[s] for s in xs],
                    alpha=0.15,
                    color=line.get_color(),
                    label=f"{_label(k).rsplit('/', 1)[0]} min-max",
                )
    ax.set_ylabel(panel.ylabel, fontsize=8)
    handles = list(lines)
    if right:
        ax2 = ax.twinx()
        ax2.tick_params(labelsize=8)
        styles = ["--", ":", "-."]
        for j, k in enumerate(right):
            x, y = series(records, k)
            (line,) = ax2.plot(
                x, y, linestyle=styles[j % 3], color=f"C{len(left) + j}", linewidth=1.5, label=_label(k)
            )
            handles.append(line)
        ax2.set_ylabel(panel.right_label, fontsize=8)
        if (
            all(0.0 <= v <= 1.0 for k in right for v in series(records, k)[1])
            and "ratio" in panel.right_label
        ):
            ax2.set_ylim(-0.02, 1.02)
    extra = [h for h in ax.get_legend_handles_labels()[0] if h not in handles]
    ax.legend(handles=handles + extra, fontsize=7, loc="best")
    return True


def _header(run_dir: Path) -> str:
    cfg = _load_yaml(run_dir / "config.yaml")
    name = (cfg.get("run") or {}).get("name") or run_dir.name
    recipe = cfg.get("recipe")
    return f"{name}" + (f" (recipe {recipe})" if recipe and recipe != name else "")


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Render ``run_dir``'s learning curves (PNG) and ``summary.md``; return the files written.

    Files go to ``out_dir`` (default ``run_dir/plots``): ``<panel>.png`` for each panel with data,
    ``overview.png`` (all of them on one page) and ``summary.md``. Raises :class:`RlzooError`
    when the directory has no ``metrics.jsonl`` records, or matplotlib is not installed.
    """
    run_dir = Path(run_dir).expanduser()
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
    plt = _pyplot()
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    keys = metric_keys(records)
    title = _header(run_dir)
    written: list[Path] = []
    drawn: list[Panel] = []
    for panel in PANELS:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
        if _draw(ax, panel, records, keys):
            fig.suptitle(title, fontsize=8, color="0.4", x=0.99, ha="right")
            fig.tight_layout()
            path = out / f"{panel.name}.png"
            fig.savefig(path)
            written.append(path)
            drawn.append(panel)
        plt.close(fig)
    if drawn:
        cols = 2 if len(drawn) > 1 else 1
        rows = math.ceil(len(drawn) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.6 * rows), dpi=90, squeeze=False)
        for ax, panel in zip(axes.flat, drawn):
            _draw(ax, panel, records, keys)
        for ax in list(axes.flat)[len(drawn) :]:
            ax.axis("off")
        fig.suptitle(f"{title}: {run_dir}", fontsize=11)
        fig.tight_layout()
        path = out / "overview.png"
        fig.savefig(path)
        plt.close(fig)
        written.insert(0, path)
    summary = out / "summary.md"
    summary.write_text(summarize_run(run_dir, records, images=[p.relative_to(out) for p in written]))
    written.append(summary)
    return written


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
