"""``summary.md``: config highlights, plugins, first / final / best value of the key metrics, and
the timing breakdown per phase."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlzoo.kernel.binding import tree_nodes
from rlzoo.report.data import _label, _numeric, match, metric_keys, series
from rlzoo.report.metrics import read_metrics
from rlzoo.report.panels import SUMMARY_KEYS, Records


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


def _optim(cfg: Mapping[str, Any]) -> str | None:
    """``lr=..., schedule, warmup`` of ``trainer.optim`` (the one home of the learning rate)."""
    optim = _get(cfg, "trainer.optim")
    if not isinstance(optim, Mapping):
        return None
    keys = ("lr", "lr_scheduler", "warmup_steps", "warmup_ratio", "weight_decay", "grad_clip")
    return ", ".join(f"{k}={_fmt_value(optim[k])}" for k in keys if k in optim) or None


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
        ("train backend", lambda: _part(cfg, "trainer.backend", ("dtype", "fsdp_size", "offload"))),
        ("optimizer", lambda: _optim(cfg)),
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

    failures = summary.get("failures") if isinstance(summary, Mapping) else None
    if isinstance(failures, Mapping) and failures.get("errors"):
        lines += ["## Failures", ""]
        lines += [
            f"{failures.get('failed_samples', 0)} of {failures.get('trained_samples', 0)} trained samples "
            f"failed; {failures.get('failed_tool_calls', 0)} tool calls failed. Tracebacks: `failures.jsonl`.",
            "",
        ]
        lines += _md_table(
            ["part", "count", "steps", "error"],
            [
                (
                    str(e.get("part")),
                    str(e.get("count")),
                    f"{e.get('first_step')}-{e.get('last_step')}",
                    str(e.get("message")),
                )
                for e in failures["errors"]
                if isinstance(e, Mapping)
            ],
        )
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
    """The plugins named by the parts (``{name, plugin, ...}`` mappings) of a saved config."""
    return {
        node["plugin"]
        for _, node in tree_nodes(cfg)
        if isinstance(node, Mapping) and isinstance(node.get("plugin"), str) and "name" in node
    }


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    h, rem = divmod(round(seconds), 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h} h {m:02d} min"
    if m:
        return f"{m} min {s:02d} s"
    return f"{seconds:.1f} s"


def _header(run_dir: Path) -> str:
    cfg = _load_yaml(run_dir / "config.yaml")
    name = (cfg.get("run") or {}).get("name") or run_dir.name
    recipe = cfg.get("recipe")
    return f"{name}" + (f" (recipe {recipe})" if recipe and recipe != name else "")
