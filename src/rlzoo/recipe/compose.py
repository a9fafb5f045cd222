"""The composition API: build a run from a recipe name, a config, or objects passed directly.

Example (runnable; ``docs/composition.md`` walks through it)::

    import rlzoo

    # 1. a recipe name + overrides
    run = rlzoo.build_run("quickstart", ["algorithm.advantage.norm_by_std=false", "trainer.total_steps=2"])

    # 2. a plain dict (or a bound RecipeConfig)
    run = rlzoo.build_run({"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}, "data": {...}})

    # 3. your own part, without registering it
    def my_loss(inputs, params):             # PolicyLossInputs -> PolicyLossOutput
        ...
    run = rlzoo.build_run("quickstart", policy_loss=rlzoo.part(my_loss, capabilities={}))

    run.train()
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.kinds import KINDS
from rlzoo.kernel.plugins import PluginManager, get_plugin_manager
from rlzoo.kernel.registry import Component
from rlzoo.recipe.checks import every_own_rule
from rlzoo.recipe.config import load_config
from rlzoo.recipe.types import RecipeConfig, Selection
from rlzoo.system.threads import choose_wait_policy

if TYPE_CHECKING:
    from rlzoo.train.loop import TrainLoop

#: keyword of build_run -> (kind, config attribute path): a kind's keyword is its name, its path
#: where a recipe selects it (``Kind.config_key``); KL has two slots of its own; environments,
#: tools, datasets and loggers are not build_run slots
_NO_OBJECT_SLOT = ("kl", "environment", "tool", "dataset", "logger")
OBJECT_SLOTS: dict[str, tuple[str, str]] = {
    **{k.name: (k.name, k.config_key) for k in KINDS if k.name not in _NO_OBJECT_SLOT},
    "kl_loss": ("kl", "algorithm.kl_loss"),
    "kl_penalty": ("kl", "algorithm.kl_penalty"),
}


@dataclass(frozen=True)
class UserPart:
    """A part given as an object rather than by registered name (see :func:`part`)."""

    target: Any
    params: Any = None
    capabilities: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    name: str | None = None


def part(
    target: Any, *, params: Any = None, capabilities: Mapping[str, Any] | None = None, name: str | None = None
) -> UserPart:
    """Wrap your own function / factory so it can be passed to :func:`build_run` with capabilities."""
    return UserPart(target, params, dict(capabilities or {}), name)


def _selection_for(kind: str, key: str, obj: Any) -> Selection:
    if isinstance(obj, Selection):
        return obj
    up = (
        obj
        if isinstance(obj, UserPart)
        else UserPart(obj, None, getattr(obj, "rlzoo_capabilities", {}) or {})
    )
    name = str(up.name or getattr(up.target, "__name__", None) or type(up.target).__name__)
    doc = getattr(up.target, "__doc__", None) or ""
    comp = Component(
        kind=kind,
        name=name,
        target=up.target,
        params=type(up.params) if dataclasses.is_dataclass(up.params) else None,
        doc=doc,
        capabilities=dict(up.capabilities),
        plugin="<python object>",
    )
    return Selection(kind, key, name, comp, up.params)


def _set_path(cfg: Any, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    obj = cfg
    for p in parents:
        obj = getattr(obj, p)
    setattr(obj, leaf, value)


class Run:
    """A composed, validated run. ``train()`` creates the run directory and runs the core's loop."""

    def __init__(self, config: RecipeConfig, pm: PluginManager) -> None:
        self.config = config
        self.pm = pm
        self.run_dir: Path | None = None
        self.lock: Any = None  # the run directory's one-writer lock (rlzoo.train.checkpoint.RunLock)
        self.resume_info: Any = None  # set by build_run for a resume from a saved config.yaml

    # -- the run directory ----------------------------------------------------------------------
    def make_run_dir(self) -> Path:
        """Create (or, with ``resume``, reuse) the run directory and record what composed it."""
        if self.run_dir is not None:
            return self.run_dir
        rc = self.config.run
        from rlzoo.system.storage import check_writable

        resume = self.config.resume not in (False, None)
        if rc.output_dir:
            path = Path(rc.output_dir).expanduser()
            check_writable(path, "run.output_dir")  # read-only / full disk: a message, nothing written
        else:
            check_writable(Path(rc.dir), "run.dir")
            if resume:
                raise ConfigError(
                    ["resume: set run.output_dir to the run directory to resume from"], header="cannot resume"
                )
            stamp = time.strftime("%Y%m%d-%H%M%S")
            path = Path(rc.dir).expanduser() / f"{rc.name}-{stamp}"
            n = 1
            while path.exists():
                n += 1
                path = Path(rc.dir).expanduser() / f"{rc.name}-{stamp}-{n}"
        from rlzoo.train.rundir import claim_run_dir

        # one writer per run directory, and one run: checked before anything is written
        self.run_dir, self.lock = claim_run_dir(
            path,
            resume=resume,
            overwrite=rc.overwrite,
            resume_command=f"rlzoo train resume=latest run.output_dir={path.expanduser().resolve()}",
        )
        if self.resume_info is None:  # a resume keeps the saved config.yaml as the record
            self.record()
        return self.run_dir

    def record(self) -> None:
        """Write the resolved config and the loaded plugins (with versions) into the run directory; a
        setting an environment variable made is written as ``${oc.env:VAR}``, not as its value
        (:meth:`~rlzoo.recipe.types.RecipeConfig.to_record`)."""
        assert self.run_dir is not None
        plugins = [p.to_json() for p in self.pm.plugins(include_all=True)]
        used = {
            s.key: {"kind": s.kind, "name": s.name, "plugin": s.component.plugin}
            for s in self.config.selections()
        }
        meta = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "python": platform.python_version(),
            "plugins": plugins,
            "parts": used,
            "versions": _library_versions(),
        }
        (self.run_dir / "plugins.json").write_text(json.dumps(meta, indent=2, default=str))
        try:
            from omegaconf import OmegaConf

            (self.run_dir / "config.yaml").write_text(
                OmegaConf.to_yaml(OmegaConf.create(self.config.to_record()))
            )
        except Exception:  # objects passed directly may not be YAML-able
            (self.run_dir / "config.json").write_text(
                json.dumps(self.config.to_record(), indent=2, default=str)
            )

    # -- running ----------------------------------------------------------------------------------
    def loop(self) -> TrainLoop:
        """The run's loop, ready to :meth:`~rlzoo.train.loop.TrainLoop.run`: the run directory claimed,
        its lock handed to the session, the session built, the runner's batch source made."""
        from rlzoo.train.checkpoint import RunLock
        from rlzoo.train.loop import build_loop

        run_dir = self.make_run_dir()
        lock, self.lock = self.lock or RunLock(run_dir).acquire(), None
        return build_loop(self.config, run_dir, lock, self.resume_info)

    def train(self) -> dict[str, Any]:
        """Train to the end with the selected runner's batch source (the core's one loop,
        :class:`rlzoo.train.loop.TrainLoop`); returns the run's summary. A recipe with ``stages``
        trains them one after the other (:func:`train_stages`)."""
        if self.config.stages:
            return train_stages(self)
        return self.loop().run()


def train_stages(run: Run) -> dict[str, Any]:
    """Train a staged recipe's stages in order, each a run of its own in ``RUN_DIR/stages/<k>-<name>/``
    (checkpoints, samples, ``final/``), stage k+1 from stage k's ``final/``.

    Resumable in any stage: a stage whose ``summary.json`` says it completed is not trained again;
    one with a checkpoint resumes from its latest; one stopped before its first checkpoint starts
    again (its attempt moved aside). ``RUN_DIR/metrics.jsonl`` holds every stage's rows in order,
    each with ``stage`` and ``stage_step`` and ``step`` counted across the stages (rewritten as each
    stage ends); ``RUN_DIR/final/`` is the last stage's; ``summary.json`` lists the stages'.
    """
    from rlzoo.recipe.stages import stage_config, stage_dir
    from rlzoo.train.checkpoint import CheckpointManager, read_summary, write_summary
    from rlzoo.train.export import copy_export, final_dir

    config = run.config
    run_dir = run.make_run_dir()
    if run.lock is not None:  # the staged run's own folder: held while its stages run
        lock, run.lock = run.lock, None
    else:
        from rlzoo.train.checkpoint import RunLock

        lock = RunLock(run_dir).acquire()
    summaries: list[dict[str, Any]] = []
    try:
        start_from: Path | None = None
        for k, stage in enumerate(config.stages):
            folder = stage_dir(run_dir, config, k)
            done = read_summary(folder) if folder.is_dir() else None
            if done is not None and done.get("ended") == "completed" and final_dir(folder).is_dir():
                print(f"rlzoo: stage {k + 1} ({stage.name}) completed earlier: {folder}", flush=True)
                summaries.append(done)
            else:
                resume = folder.is_dir() and CheckpointManager(folder).latest() is not None
                print(
                    f"rlzoo: stage {k + 1}/{len(config.stages)} ({stage.name}) "
                    f"{'resumes' if resume else 'starts'} in {folder}",
                    flush=True,
                )
                cfg = stage_config(
                    config,
                    k,
                    run.pm,
                    run_dir=run_dir,
                    start_from=start_from,
                    resume=resume,
                    overwrite=folder.is_dir() and not resume,
                )
                try:
                    summaries.append(Run(cfg, run.pm).train())
                except BaseException:  # the stage printed its own folder's resume; the run's is this one
                    print(
                        f"rlzoo: the staged run stopped in stage {k + 1} ({stage.name}); resume the whole run "
                        f"(from that stage) with:\n  rlzoo train resume=latest run.output_dir={run_dir}",
                        flush=True,
                    )
                    raise
                if summaries[-1].get("ended") != "completed":
                    break
            _join_metrics(run_dir, config, summaries)
            start_from = final_dir(folder)
        last = summaries[-1]
        if last.get("ended") == "completed" and len(summaries) == len(config.stages):
            copy_export(final_dir(stage_dir(run_dir, config, len(summaries) - 1)), final_dir(run_dir))
        summary = {
            **last,
            "run_dir": str(run_dir),
            "stages": [{"name": s.name, **sm} for s, sm in zip(config.stages, summaries)],
            "resume_command": f"rlzoo train resume=latest run.output_dir={run_dir}",
        }
        write_summary(run_dir, summary)
        return summary
    finally:
        lock.release()


def _join_metrics(run_dir: Path, config: RecipeConfig, summaries: Sequence[Mapping[str, Any]]) -> None:
    """``RUN_DIR/metrics.jsonl``: the stages' rows so far, in order, with ``stage``, ``stage_step``
    and ``step`` counted across stages (written aside, then renamed)."""
    from rlzoo.recipe.stages import stage_dir
    from rlzoo.report.metrics import read_metrics

    lines: list[str] = []
    offset = 0
    for k in range(len(summaries)):
        stage = config.stages[k]
        for row in read_metrics(stage_dir(run_dir, config, k)):
            lines.append(
                json.dumps(
                    {**row, "step": offset + int(row["step"]), "stage": stage.name, "stage_step": row["step"]}
                )
            )
        offset += int(summaries[k].get("steps") or 0)
    tmp = run_dir / "metrics.jsonl.tmp"
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.replace(run_dir / "metrics.jsonl")


def _library_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in ("rlzoo", "torch", "transformers", "ray", "vllm", "megatron-core", "pluggy", "hydra-core"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def build_run(
    config: str | Mapping[str, Any] | RecipeConfig | None = None,
    overrides: Sequence[str] | None = None,
    *,
    pm: PluginManager | None = None,
    **objects: Any,
) -> Run:
    """Compose a run.

    ``config`` is a recipe name or path, a plain mapping, or a bound :class:`RecipeConfig`
    (default: on a resume the run directory's saved config, else ``quickstart``);
    ``overrides`` are ``key=value`` strings. Keyword arguments put objects straight into part
    slots (``policy_loss=my_fn``, ``scorer=...``; see :data:`OBJECT_SLOTS`), no registration needed.
    """
    choose_wait_policy()  # OpenMP waiting (rlzoo.system.threads): a run starts, torch is not loaded yet
    pm = pm or get_plugin_manager()
    unknown = sorted(set(objects) - set(OBJECT_SLOTS))
    if unknown:
        raise ConfigError(
            [f"{k}: not a part slot; slots are {', '.join(sorted(OBJECT_SLOTS))}" for k in unknown],
            header="build_run got unknown keyword arguments",
        )
    from rlzoo.train.rundir import load_resumed

    # a resume continues the run directory's saved config, changed only by the overrides given now
    resumed = (
        load_resumed(list(overrides or ()), pm, recipe=config)
        if config is None or isinstance(config, str)
        else None
    )
    if resumed is not None:
        cfg = resumed[0]
    else:
        cfg = load_config("quickstart" if config is None else config, list(overrides or ()), pm)
    for slot, obj in objects.items():
        kind, path = OBJECT_SLOTS[slot]
        _set_path(cfg, path, _selection_for(kind, path, obj))
    if objects:  # parts placed now were not there when load_config checked the recipe
        problems = every_own_rule(cfg)
        if problems:
            raise ConfigError(problems)
    if cfg.stages:  # every stage's recipe binds, before anything runs
        from rlzoo.recipe.stages import check_stages

        problems = check_stages(cfg, pm)
        if problems:
            raise ConfigError(problems, header="invalid stages")
    run = Run(cfg, pm)
    run.resume_info = resumed[1] if resumed is not None else None
    return run
