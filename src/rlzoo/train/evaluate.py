"""``rlzoo eval TARGET [TARGET2]``: a model on a task's prompts, n samples each, with the numbers
papers report (avg@n, pass@k, maj@k; :mod:`rlzoo.report.passk`) and bootstrap intervals.

A target is a run directory (``RUN`` or ``RUN@latest``: its newest checkpoint, ``RUN@best``: the
best validated one, ``RUN@K``: step K, ``RUN@0`` / ``RUN@base``: the model it started from), an
export (``RUN/final``, ``RUN/export/step_K``, ``rlzoo export``'s folder) or any HF model folder
(with ``--recipe``). The recipe of a run (its ``config.yaml``) says how prompts are rendered, which
scorer judges, which rollout backend generates and, for agents, which environment and tools the
trajectories use, or which agent plays each episode through the gateway (an episode the gateway
split into several samples counts once, with its last call's answer): generation goes through the
very rollout backend (and multi-turn or gateway rollout) a training run uses; nothing here
generates on its own. ``--dataset NAME`` evaluates on a registered
dataset instead (prepared once, its test / validation split), ``key=value`` overrides change the
recipe (e.g. ``rollout.backend.name=vllm``).

Resumable: each prompt's results are appended to ``results.jsonl`` as they come; run the same
command again after a kill and the prompts already done are skipped. At the end
``results.parquet``, ``report.md`` and ``summary.json`` are written into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlzoo.kernel.commands import CliCommand
from rlzoo.kernel.errors import ConfigError, RlzooError
from rlzoo.kernel.protocols import GenerationRequest, RewardResult, Sample
from rlzoo.report.passk import Estimate, PromptResult, bootstrap, paired_bootstrap, per_prompt

logger = logging.getLogger("rlzoo")

RESULTS = "results.jsonl"
SETTINGS = "eval.json"


@dataclass(frozen=True)
class Target:
    """What one TARGET argument names, resolved."""

    label: str  # as given
    model_path: Path  # the HF folder generation loads
    config: Any  # the eval's RecipeConfig (model.path = model_path)
    step: int | None  # the training step the weights are from (None: unknown)


@dataclass(frozen=True)
class EvalSettings:
    n: int  # samples per prompt
    temperature: float  # 0: greedy
    seed: int
    threshold: float  # a sample is correct when its acc >= threshold
    limit: int | None  # first prompts only
    batch: int  # prompts per generation call
    bootstrap: int  # bootstrap resamples
    level: float  # interval level


# ---------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------
def _run_dir_of(folder: Path) -> Path | None:
    """The run directory a folder is (config.yaml) or lies in (final/, export/step_K/)."""
    for d in (folder, folder.parent, folder.parent.parent):
        if (d / "config.yaml").is_file() and (d / "metrics.jsonl").exists():
            return d
    return None


def _checkpoint_folder(run_dir: Path, which: str, cache: Path) -> tuple[Path, int | None]:
    """The HF folder of checkpoint ``which`` (latest / best / K / 0 / base) of ``run_dir``."""
    from rlzoo.train.checkpoint import CheckpointManager
    from rlzoo.train.export import export_checkpoint, export_step, final_dir, load_run_config, step_dir

    if which in ("0", "base"):
        return Path(load_run_config(run_dir).model.path).expanduser(), 0
    ckpt = CheckpointManager(run_dir)
    steps = ckpt.steps()
    if which == "latest":
        if not steps:
            if final_dir(run_dir).is_dir():
                return final_dir(run_dir), export_step(final_dir(run_dir))
            raise RlzooError(f"{run_dir} has no checkpoint and no final/ folder: nothing to evaluate")
        step = steps[-1]
    elif which == "best":
        best = ckpt.best_step()
        if best is None:
            raise RlzooError(
                f"{run_dir}: no checkpoint recorded a validation score (RUN@best needs trainer.test_freq "
                "to validate at a checkpoint step); use RUN@latest or RUN@K"
            )
        step = best
    else:
        try:
            step = int(which)
        except ValueError:
            raise RlzooError(f"{run_dir}@{which}: after @ give latest, best, base or a step number") from None
    for folder in (step_dir(run_dir, step), final_dir(run_dir)):  # an export of that very step
        if folder.is_dir() and export_step(folder) == step:
            return folder, step
    if step not in steps:
        have = ", ".join(map(str, steps)) or "none"
        raise RlzooError(
            f"{run_dir} has no checkpoint of step {step} (checkpoints: {have}; @0 is the base model)"
        )
    out = cache / f"{run_dir.name}-step_{step}"
    if not (out.is_dir() and export_step(out) == step):
        print(f"rlzoo eval: exporting checkpoint {step} of {run_dir} to {out}", flush=True)
        export_checkpoint(run_dir, out, step=step)
    return out, step


def resolve_target(
    spec: str, *, recipe: str | None, overrides: Sequence[str], cache: Path, pm: Any = None
) -> Target:
    """A TARGET argument as a model folder and the recipe that evaluates it."""
    from rlzoo.recipe.config import load_config, strip_plugin_notes
    from rlzoo.train.export import export_step

    path_s, _, which = spec.partition("@")
    path = Path(path_s).expanduser()
    if not path.exists():
        raise RlzooError(f"target {spec!r}: {path} does not exist (give a run directory or a model folder)")
    run_dir = _run_dir_of(path)
    if run_dir == path:
        model, step = _checkpoint_folder(path, which or "latest", cache)
    else:
        if which:
            raise RlzooError(f"target {spec!r}: @{which} is for a run directory; {path} is a model folder")
        if not (path / "config.json").is_file():
            raise RlzooError(
                f"target {spec!r}: {path} is neither a run directory nor a model folder (config.json)"
            )
        model, step = path, export_step(path)
    if recipe is not None:
        base: Any = recipe
    elif run_dir is not None:
        import yaml

        base = strip_plugin_notes(yaml.safe_load((run_dir / "config.yaml").read_text()))
    else:
        raise RlzooError(
            f"target {spec!r} is a model folder outside a run directory: name the recipe that says how to "
            "prompt and score it, e.g. --recipe quickstart"
        )
    if isinstance(base, str):  # a recipe: composed with its interpolations (model.path may feed others)
        config = load_config(base, [f"model.path={model}", "resume=false", *overrides], pm)
    else:  # a run's saved config: set as values, not as override lines, since a path the override
        # grammar cannot read (with '~', '=', '(' or a non-ASCII letter) is still a valid folder
        raw = {**base, "model": {**base["model"], "path": str(model)}, "resume": False}
        config = load_config(raw, list(overrides), pm)
    return Target(spec, Path(model), config, step)


def dataset_overrides(name: str, data_dir: Path, split: str, pm: Any = None) -> list[str]:
    """Prepare the registered dataset ``name`` (once) and point the recipe at its ``split``."""
    from rlzoo.kernel.plugins import get_plugin_manager
    from rlzoo.recipe.config import bind_part

    problems: list[str] = []
    sel = bind_part("dataset", {"name": name}, "--dataset", problems, pm or get_plugin_manager())
    if problems or sel is None:
        raise ConfigError(problems, header=f"cannot evaluate on {name!r}")
    data_dir.mkdir(parents=True, exist_ok=True)
    files = {k: str(v) for k, v in sel.fn(data_dir, sel.params).items()}
    order = [split] if split != "auto" else ["test", "val", "validation", "train"]
    chosen = next((files[k] for k in order if k in files), None)
    if chosen is None:
        raise RlzooError(f"dataset {name!r} has no {split!r} split (it has: {', '.join(files)})")
    return [f"data.train_files=[{chosen}]", f"data.val_files=[{chosen}]", "data.train_batch_size=1"]


# ---------------------------------------------------------------------------------------------
# generation and scoring
# ---------------------------------------------------------------------------------------------
class _Engine:
    """The recipe's rollout backend (and multi-turn rollout), its tokenizer, prompts and reward manager."""

    def __init__(self, config: Any, split: str) -> None:
        from rlzoo.placement import make_placement
        from rlzoo.train.inputs import run_inputs
        from rlzoo.train.session import episode_rollout

        inputs = run_inputs(config)
        self.config = config
        self.inputs = inputs
        data = inputs.data
        dataset = data.train if split == "train" or data.val is None else data.val
        self.items = [dataset[i] for i in range(len(dataset))]
        setup = inputs.backends
        self.placement = make_placement(setup.placement)
        self.engine = self.placement.rollout_backend(setup.rollout, setup.rollout_spec)
        # the run's own trajectories: multi-turn with its environment, or its agent through the gateway
        self.rollout = episode_rollout(self.engine, inputs)

    def requests(self, indices: Sequence[int], settings: EvalSettings) -> list[GenerationRequest]:
        from rlzoo.train.batching import make_requests, sampling_params

        base = sampling_params(self.config, val=True, n=settings.n)
        greedy = settings.temperature <= 0
        out: list[GenerationRequest] = []
        for i in indices:  # the seed of a prompt depends on its index only: a resume draws the same
            sp = dataclasses.replace(
                base,
                greedy=greedy,
                temperature=1.0 if greedy else settings.temperature,
                seed=settings.seed * 1_000_003 + i,
            )
            sp = dataclasses.replace(sp, seed=None) if greedy else sp
            out += make_requests([self.items[i]], sp, prefix=f"eval{i}", processor=self.inputs.data.processor)
        return out

    def close(self) -> None:
        shut = getattr(self.rollout, "shutdown", None)
        if callable(shut):
            shut()
        self.placement.shutdown()


def episode_answers(
    samples: Sequence[Sample], results: Sequence[RewardResult]
) -> list[tuple[Sample, RewardResult]]:
    """One (sample, result) per episode: an agent's episode the gateway split into several samples
    (its history edited: ``agent["gateway"]["segments"] > 1``) is one answer, its last call's; every
    other sample is its own episode."""
    out = []
    for s, r in zip(samples, results, strict=True):
        gw = (s.agent or {}).get("gateway")
        if gw is None or gw["segment"] == gw["segments"] - 1:
            out.append((s, r))
    return out


def _prompt_rows(
    engine: _Engine, label: str, indices: Sequence[int], settings: EvalSettings
) -> list[dict[str, Any]]:
    from rlzoo.train.rewards import score_samples

    reqs = engine.requests(indices, settings)
    samples = engine.rollout.generate(reqs)
    tok = engine.inputs.data.tokenizer
    results = score_samples(engine.inputs.reward.manager, tok, samples)
    by_prompt: dict[str, list[tuple[Any, Any]]] = {}
    for s, r in episode_answers(samples, results):
        by_prompt.setdefault(s.request_id, []).append((s, r))
    rows = []
    for i, req in zip(indices, reqs):
        pairs = sorted(by_prompt.get(req.request_id, []), key=lambda p: p[0].index)
        item = engine.items[i]
        accs = [float(r.info.get("acc", r.score)) if not r.failed else 0.0 for _, r in pairs]
        preds = [r.info.get("pred") for _, r in pairs]
        rows.append(
            {
                "target": label,
                "index": i,
                "data_source": str(item.get("data_source", "default")),
                "prompt": tok.decode(list(item["prompt_ids"])),
                "ground_truth": json.dumps(item.get("ground_truth"), default=str),
                "responses": [tok.decode(s.response_ids) for s, _ in pairs],
                "acc": accs,
                "correct": [a >= settings.threshold for a in accs],
                "pred": [None if p is None else str(p) for p in preds],
                "failed": [bool(r.failed) for _, r in pairs],
                "finish_reason": [s.finish_reason for s, _ in pairs],
                "response_length": [len(s.response_ids) for s, _ in pairs],
                "turns": [int(s.agent["turns"]) if s.agent else 1 for s, _ in pairs],
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# the results file (append-only, resumable)
# ---------------------------------------------------------------------------------------------
def read_results(out: Path) -> list[dict[str, Any]]:
    """The complete lines of ``results.jsonl``; a line a kill cut short is dropped from the file."""
    path = out / RESULTS
    if not path.is_file():
        return []
    rows, good = [], 0
    with open(path, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break
            try:
                rows.append(json.loads(line))
            except ValueError:
                break
            good += len(line)
    if good < path.stat().st_size:  # ours, cut by a kill: the prompt is evaluated again
        with open(path, "rb+") as fh:
            fh.truncate(good)
    return rows


def _append(out: Path, rows: Sequence[dict[str, Any]]) -> None:
    with open(out / RESULTS, "a", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _check_settings(out: Path, record: dict[str, Any]) -> None:
    path = out / SETTINGS
    if path.is_file():
        before = json.loads(path.read_text())
        if before != record:
            changed = sorted(k for k in {*before, *record} if before.get(k) != record.get(k))
            raise RlzooError(
                f"{out} holds an evaluation with other settings ({', '.join(changed)} differ); give another "
                "--out, or the same arguments to continue it"
            )
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# the evaluation
# ---------------------------------------------------------------------------------------------
def evaluate(
    specs: Sequence[str],
    settings: EvalSettings,
    *,
    out: Path,
    recipe: str | None = None,
    overrides: Sequence[str] = (),
    dataset: str | None = None,
    data_dir: Path | None = None,
    split: str = "auto",
    progress: bool = True,
    pm: Any = None,
) -> dict[str, Any]:
    """Evaluate one or two targets on the same prompts; returns the summary (also written to ``out``)."""
    if not 1 <= len(specs) <= 2:
        raise RlzooError(f"rlzoo eval takes one or two targets, got {len(specs)}")
    if len(set(specs)) != len(specs):
        raise RlzooError("the two targets are the same; compare two different ones")
    over = list(overrides)
    if dataset is not None:
        over += dataset_overrides(dataset, data_dir or Path("data") / dataset, split, pm)
    if out.exists() and not (out / SETTINGS).is_file() and (not out.is_dir() or any(out.iterdir())):
        raise RlzooError(
            f"--out {out} is not an empty folder and holds no rlzoo evaluation; give a new folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    targets = [resolve_target(s, recipe=recipe, overrides=over, cache=out / "models", pm=pm) for s in specs]
    if len(targets) == 2:  # the same prompts: the second reads the first's files
        first = targets[0].config.data
        t2 = targets[1]
        from rlzoo.recipe.config import load_config, strip_plugin_notes

        raw = strip_plugin_notes(t2.config.to_dict())
        raw["data"] = {
            **raw["data"],
            "val_files": list(first.val_files),
            "train_files": list(first.train_files),
        }
        targets[1] = dataclasses.replace(t2, config=load_config(raw, [], pm))
    record = {
        "targets": [{"target": t.label, "model": str(t.model_path), "step": t.step} for t in targets],
        "n": settings.n,
        "temperature": settings.temperature,
        "seed": settings.seed,
        "threshold": settings.threshold,
        "limit": settings.limit,
        "split": split,
        "dataset": dataset,
        "overrides": list(overrides),
    }
    _check_settings(out, record)
    done = {(r["target"], r["index"]) for r in read_results(out)}
    n_prompts: int | None = None
    for t in targets:
        n_prompts = _run_target(t, settings, out, done, split, progress, n_prompts)
    return summarize(out, [t.label for t in targets], settings, record)


def _run_target(
    t: Target,
    settings: EvalSettings,
    out: Path,
    done: set[tuple[str, int]],
    split: str,
    progress: bool,
    n_prompts: int | None,
) -> int:
    engine = _Engine(t.config, "train" if split == "train" else "val")
    try:
        total = len(engine.items) if settings.limit is None else min(settings.limit, len(engine.items))
        if n_prompts is not None and total != n_prompts:
            raise RlzooError(
                f"{t.label} has {total} prompts, the first target {n_prompts}: not the same prompts"
            )
        todo = [i for i in range(total) if (t.label, i) not in done]
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, initial=total - len(todo), desc=f"eval {t.label}", unit="prompt")
        for start in range(0, len(todo), settings.batch):
            chunk = todo[start : start + settings.batch]
            try:
                rows = _prompt_rows(engine, t.label, chunk, settings)
            except RlzooError:
                raise
            except Exception as exc:
                raise RlzooError(
                    f"{t.label}: generation or scoring failed on prompts {chunk[0]}..{chunk[-1]}: "
                    f"{type(exc).__name__}: {exc} (the prompts done so far are kept in {out / RESULTS}; "
                    "the same command continues)"
                ) from exc
            _append(out, rows)
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        return total
    finally:
        engine.close()


def _fmt(e: Estimate) -> str:
    return f"{e.value:.3f} [{e.low:.3f}, {e.high:.3f}]"


def summarize(
    out: Path, labels: Sequence[str], settings: EvalSettings, record: dict[str, Any]
) -> dict[str, Any]:
    """The metrics of the results in ``out`` (per target, and the paired difference of two)."""
    rows = read_results(out)
    by: dict[str, dict[int, dict[str, Any]]] = {lab: {} for lab in labels}
    for r in rows:
        if r["target"] in by:
            by[r["target"]][int(r["index"])] = r
    common = sorted(set.intersection(*(set(v) for v in by.values())))
    if settings.limit is not None:
        common = [i for i in common if i < settings.limit]
    values: dict[str, dict[str, list[float]]] = {}
    for lab in labels:
        prs = [
            PromptResult(tuple(by[lab][i]["acc"]), tuple(by[lab][i]["correct"]), tuple(by[lab][i]["pred"]))
            for i in common
        ]
        values[lab] = per_prompt(prs, seed=settings.seed)
    kw: dict[str, Any] = {"samples": settings.bootstrap, "level": settings.level, "seed": settings.seed}
    metrics = list(values[labels[0]])
    table: dict[str, dict[str, Estimate]] = {
        lab: {m: bootstrap(values[lab][m], **kw) for m in metrics if m in values[lab]} for lab in labels
    }
    diff: dict[str, Estimate] = {}
    if len(labels) == 2:
        a, b = values[labels[0]], values[labels[1]]
        diff = {m: paired_bootstrap(a[m], b[m], **kw) for m in metrics if m in a and m in b}
    summary = {
        **record,
        "prompts": len(common),
        "level": settings.level,
        "metrics": {lab: {m: dataclasses.asdict(e) for m, e in table[lab].items()} for lab in labels},
        "difference": {m: dataclasses.asdict(e) for m, e in diff.items()},
    }
    _write_outputs(out, rows, summary, labels, table, diff, settings)
    return summary


def _write_outputs(
    out: Path,
    rows: list[dict[str, Any]],
    summary: dict[str, Any],
    labels: Sequence[str],
    table: dict[str, dict[str, Estimate]],
    diff: dict[str, Estimate],
    settings: EvalSettings,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def atomic(name: str, write: Any) -> None:
        tmp = out / f".{name}.tmp"
        write(tmp)
        os.replace(tmp, out / name)

    if rows:
        atomic("results.parquet", lambda p: pq.write_table(pa.Table.from_pylist(rows), p))
    atomic("summary.json", lambda p: p.write_text(json.dumps(summary, indent=2)))
    atomic("report.md", lambda p: p.write_text(report_markdown(summary, labels, table, diff, settings)))


def report_markdown(
    summary: dict[str, Any],
    labels: Sequence[str],
    table: dict[str, dict[str, Estimate]],
    diff: dict[str, Estimate],
    settings: EvalSettings,
) -> str:
    level = round(settings.level * 100)
    sampling = "greedy" if settings.temperature <= 0 else f"temperature {settings.temperature:g}"
    lines = [
        "# rlzoo eval",
        "",
        f"{summary['prompts']} prompts, n={settings.n} samples each ({sampling}, seed {settings.seed}); a sample is "
        f"correct when its acc >= {settings.threshold:g}. Intervals: {level}% percentile bootstrap over prompts "
        f"({settings.bootstrap} resamples){'; the difference is paired (same prompts)' if diff else ''}.",
        "",
    ]
    for t in summary["targets"]:
        lines.append(f"- `{t['target']}`: {t['model']} (step {t['step'] if t['step'] is not None else '?'})")
    lines.append("")
    header = ["metric", *[f"`{lab}`" for lab in labels]] + (["difference (2nd - 1st)"] if diff else [])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in table[labels[0]]:
        cells = [m, *[_fmt(table[lab][m]) if m in table[lab] else "" for lab in labels]]
        if diff:
            cells.append(_fmt(diff[m]) if m in diff else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def print_summary(summary: dict[str, Any], labels: Sequence[str]) -> None:
    level = round(summary["level"] * 100)
    print(f"rlzoo eval: {summary['prompts']} prompts, n={summary['n']}; mean [{level}% bootstrap interval]")
    width = max(len(m) for m in summary["metrics"][labels[0]]) if summary["metrics"][labels[0]] else 8
    head = f"  {'metric':<{width}}  " + "  ".join(f"{lab[-28:]:<28}" for lab in labels)
    if summary["difference"]:
        head += "  difference (2nd - 1st)"
    print(head)
    for m in summary["metrics"][labels[0]]:
        cells = [
            _fmt(Estimate(**summary["metrics"][lab][m])) for lab in labels if m in summary["metrics"][lab]
        ]
        line = f"  {m:<{width}}  " + "  ".join(f"{c:<28}" for c in cells)
        if m in summary["difference"]:
            line += "  " + _fmt(Estimate(**summary["difference"][m]))
        print(line)


# ---------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------
def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "args",
        nargs="+",
        metavar="TARGET",
        help="one or two targets (RUN_DIR[@latest|@best|@K|@0], an export or a model folder), then key=value "
        "overrides of the recipe",
    )
    p.add_argument("--n", type=int, default=1, help="samples per prompt (pass@k and maj@k for every k <= n)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0: greedy (default with --n 1); default with --n > 1: the recipe's rollout.temperature",
    )
    p.add_argument(
        "--recipe", help="the recipe of a model folder outside a run directory (prompts, scorer, backend)"
    )
    p.add_argument("--dataset", help="a registered dataset to evaluate on (rlzoo components dataset)")
    p.add_argument("--data-dir", help="where --dataset is prepared (default: data/NAME)")
    p.add_argument(
        "--split",
        default="auto",
        help="train, val or test prompts (default: the validation files, else train)",
    )
    p.add_argument("--limit", type=int, help="only the first N prompts")
    p.add_argument("--batch", type=int, default=16, help="prompts per generation call")
    p.add_argument("--threshold", type=float, default=1.0, help="a sample is correct when its acc >= this")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--level", type=float, default=0.95, help="interval level")
    p.add_argument("--out", help="output folder (default: eval/<first target's name>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _run(ns: argparse.Namespace) -> int:
    from rlzoo.report.console import quiet_third_party_progress

    quiet_third_party_progress()  # before transformers loads anything
    specs = [a for a in ns.args if "=" not in a]
    overrides = [a for a in ns.args if "=" in a]
    problems = []
    if ns.n < 1:
        problems.append(f"--n {ns.n}: give at least 1 sample per prompt")
    if ns.limit is not None and ns.limit < 1:
        problems.append(f"--limit {ns.limit}: give at least 1 prompt")
    if ns.batch < 1:
        problems.append(f"--batch {ns.batch}: give at least 1")
    if not 0 < ns.level < 1:
        problems.append(f"--level {ns.level}: an interval level is in (0, 1), e.g. 0.95")
    if ns.bootstrap < 1:
        problems.append(f"--bootstrap {ns.bootstrap}: give at least 1 resample")
    if ns.split not in ("auto", "train", "val", "test"):
        problems.append(f"--split {ns.split!r}: train, val, test or auto")
    if problems:
        raise ConfigError(problems, header="rlzoo eval")
    temperature = ns.temperature
    if temperature is None:
        temperature = 0.0 if ns.n == 1 else -1.0  # -1: the recipe's, read below
    if temperature < 0:
        from rlzoo.train.export import load_run_config

        first = Path(specs[0].partition("@")[0]).expanduser() if specs else Path(".")
        run_dir = _run_dir_of(first) if first.exists() else None
        temperature = load_run_config(run_dir).rollout.temperature if run_dir else 1.0
    settings = EvalSettings(
        n=ns.n,
        temperature=temperature,
        seed=ns.seed,
        threshold=ns.threshold,
        limit=ns.limit,
        batch=ns.batch,
        bootstrap=ns.bootstrap,
        level=ns.level,
    )
    default_out = Path("eval") / "-".join(
        Path(s.partition("@")[0]).name + (f"@{s.partition('@')[2]}" if "@" in s else "") for s in specs
    )
    out = Path(ns.out).expanduser() if ns.out else default_out
    summary = evaluate(
        specs,
        settings,
        out=out,
        recipe=ns.recipe,
        overrides=overrides,
        dataset=ns.dataset,
        data_dir=Path(ns.data_dir).expanduser() if ns.data_dir else None,
        split=ns.split,
        progress=not ns.no_progress,
    )
    print_summary(summary, specs)
    print(
        f"rlzoo eval: per-prompt results {out / RESULTS} and {out / 'results.parquet'}; report {out / 'report.md'}"
    )
    return 0


EXAMPLES = """\
  rlzoo eval runs/quickstart-20250101-120000                      # its latest checkpoint, greedy
  rlzoo eval runs/q@0 runs/q@latest --n 8                          # base model vs trained: pass@1..8, the difference
  rlzoo eval runs/q/final --dataset gsm8k --n 4 --limit 200         # on a registered dataset
  rlzoo eval models/mine rollout.backend.name=vllm --recipe grpo_smollm2_arith --n 16"""


def eval_command() -> CliCommand:
    return CliCommand(
        name="eval",
        summary="evaluate a checkpoint, an export or a model on a task: avg@n, pass@k, maj@k with intervals",
        add_arguments=_add_arguments,
        run=_run,
        examples=EXAMPLES,
    )
