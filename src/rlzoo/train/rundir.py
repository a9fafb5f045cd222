"""A run directory belongs to one run; a resume continues it exactly.

``rlzoo train RECIPE resume=latest run.output_dir=DIR [overrides]`` reloads ``DIR/config.yaml``
(everything the run was started with, its command-line overrides included), replays the overrides
of every earlier resume recorded in ``DIR/resumes.yaml`` in order, and applies the overrides given
now. The changes are printed as a diff; ``config.yaml`` is never rewritten, and the resume is
appended to ``resumes.yaml`` only once its checkpoint has loaded (a failed attempt is not
recorded). A directory without a saved config (e.g. a copied checkpoint) resumes from the recipe
and overrides given, and says so.

A fresh run into a directory that already holds a run is refused with the command that resumes it
(:func:`claim_run_dir`); ``run.overwrite=true`` moves the old run aside, never deletes it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import ConfigError
from rlzoo.recipe.config import load_config, strip_plugin_notes
from rlzoo.recipe.types import RecipeConfig
from rlzoo.train.checkpoint import LOCK_FILE

#: overrides that say where and whether to resume; never recorded as changes of the run
_RESUME_KEYS = ("resume", "run.output_dir", "run.overwrite")
#: what a run directory holds before its first step (a run that stopped while checking its inputs)
#: (Run.record writes the settings and plugins; RunLock its lock file)
_SETTINGS = {"config.yaml", "config.json"}
_BOOKKEEPING = {LOCK_FILE, "plugins.json", *_SETTINGS}


@dataclass
class ResumeInfo:
    """What a resume command changed in the saved config."""

    run_dir: Path
    overrides: list[str]
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)


def _key_value(override: str) -> tuple[str, str]:
    """``key`` and raw ``value`` of ``[+|++|~]key[=value]``."""
    key, _, value = override.lstrip("+~").partition("=")
    return key.strip(), value.strip()


def resume_request(overrides: Sequence[str]) -> tuple[bool, str | None]:
    """(whether ``overrides`` ask to resume, the ``run.output_dir`` they name)."""
    resume, out = False, None
    for o in overrides:
        key, value = _key_value(o)
        if key == "resume":
            resume = value.lower() not in ("", "false", "no", "off", "null", "none")
        elif key == "run.output_dir":
            out = value
    return resume, out


def _apply(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply overrides in order, parsed as Hydra parses them: ``~k`` deletes, ``[+]k=v`` sets
    (a mapping for a part of the same name is merged into it; a part switched by name is replaced)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    out: dict[str, Any] = raw
    for ov in OverridesParser.create().parse_overrides(list(overrides)):
        parts = ov.key_or_group.split(".")
        node: Any = out
        for p in parts[:-1]:
            if ov.is_delete():
                node = node.get(p) if isinstance(node, dict) else None
            else:
                node = node.setdefault(p, {})
        if ov.is_delete():
            if isinstance(node, dict):
                node.pop(parts[-1], None)
            continue
        value = ov.value()
        old = node.get(parts[-1])
        if (
            isinstance(old, dict)
            and isinstance(value, dict)
            and value.get("name", old.get("name")) == old.get("name")
        ):
            merged = OmegaConf.merge(OmegaConf.create(old), OmegaConf.create(value))
            node[parts[-1]] = OmegaConf.to_container(merged, resolve=True)
        else:
            node[parts[-1]] = value
    return out


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: d}


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    a, b = _flat(before), _flat(after)
    return {
        k: (a.get(k), b.get(k))
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) and k not in _RESUME_KEYS and not k.endswith(".plugin")
    }


def _read_yaml(path: Path, what: str) -> Any:
    """``path`` parsed, or a :class:`ConfigError` that names the file and what to do."""
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            [f"{path}: cannot read {what} ({detail})"],
            header=f"cannot resume from {path.parent}: its {path.name} is damaged; restore it from a "
            "backup, or start a new run (another run.output_dir)",
        ) from None


def _resolve_env(saved: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The saved settings with the ``${oc.env:VAR}`` a recipe wrote resolved now, from this
    process's environment (config.yaml keeps them unresolved: no variable's value is saved)."""
    from omegaconf import OmegaConf

    try:
        out = OmegaConf.to_container(OmegaConf.create(dict(saved)), resolve=True)
    except Exception as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            [f"{path}: {detail}"],
            header=f"cannot resume from {path.parent}: a setting of its config.yaml reads an environment "
            "variable that is not set now; set it as it was when the run started",
        ) from None
    assert isinstance(out, dict)
    return out  # type: ignore[return-value]


def earlier_resumes(run_dir: Path) -> list[dict[str, Any]]:
    """The resumes recorded in ``run_dir/resumes.yaml``, oldest first."""
    path = Path(run_dir) / "resumes.yaml"
    if not path.is_file():
        return []
    entries = _read_yaml(path, "the record of earlier resumes") or []
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise ConfigError([f"{path}: not a list of resume records"], header=f"cannot resume from {run_dir}")
    return [dict(e) for e in entries]


def _replayable(overrides: Sequence[str]) -> list[str]:
    return [o for o in overrides if _key_value(o)[0] not in _RESUME_KEYS]


def _recipe_name(recipe: str) -> str:
    return Path(recipe).stem if recipe.endswith((".yaml", ".yml")) else recipe


def load_resumed(
    overrides: Sequence[str], pm: Any, recipe: str | None = None
) -> tuple[RecipeConfig, ResumeInfo] | None:
    """The config of a resume: the saved one, every earlier resume's overrides in order, then
    ``overrides``; None when this is no resume or the run directory has no saved ``config.yaml``.

    ``recipe``: the recipe the command named (None: none named); a resume continues the saved
    config, so naming another recipe is an error rather than silently ignored.
    """
    resume, out = resume_request(overrides)
    if not resume or not out:
        return None
    run_dir = Path(out).expanduser()
    require_existing_run_dir(run_dir)
    saved_file = run_dir / "config.yaml"
    if not saved_file.is_file():
        print(
            f"rlzoo: resume: {run_dir} has no saved config.yaml; using the recipe and overrides given",
            flush=True,
        )
        return None
    saved = _read_yaml(saved_file, "the run's saved settings")
    if not isinstance(saved, Mapping):
        raise ConfigError(
            [f"{saved_file}: not a mapping of settings (got {type(saved).__name__})"],
            header=f"cannot resume from {run_dir}: its config.yaml is damaged",
        )
    saved = strip_plugin_notes(_resolve_env(saved, saved_file))
    started = saved.get("recipe")
    if recipe is not None and started and _recipe_name(recipe) != str(started):
        raise ConfigError(
            [
                f"recipe: the resume names {recipe!r}, but {run_dir} was started from {started!r}; a resume "
                "continues the run's saved config.yaml. Drop the recipe name (or name "
                f"{started!r}); to train {recipe!r}, start a new run (another run.output_dir)"
            ],
            header="cannot resume",
        )
    replayed: list[str] = []
    try:
        base = load_config(saved, [], pm)
        for entry in earlier_resumes(run_dir):  # compose: every earlier resume, in order
            again = _replayable(entry.get("overrides") or [])
            raw = _apply(strip_plugin_notes(base.to_dict()), again)
            base = load_config(raw, [], pm)
            replayed += again
    except ConfigError as exc:
        raise ConfigError(
            exc.problems,
            header=f"cannot resume from {run_dir}: its config.yaml / resumes.yaml no longer bind",
        ) from exc
    raw = _apply(strip_plugin_notes(base.to_dict()), list(overrides))
    cfg = load_config(raw, [], pm)
    info = ResumeInfo(run_dir.resolve(), list(overrides), diff(base.to_dict(), cfg.to_dict()))
    source = "its config.yaml"
    if replayed:  # say what the earlier resumes still change, in the order they are applied
        source += f" with the overrides of earlier resumes (resumes.yaml) replayed: {' '.join(replayed)};"
    if info.changes:
        lines = "\n".join(f"  {k}: {old!r} -> {new!r}" for k, (old, new) in info.changes.items())
        print(f"rlzoo: resuming {run_dir} from {source} with these changes now:\n{lines}", flush=True)
    elif replayed:
        print(f"rlzoo: resuming {run_dir} from {source} no new changes", flush=True)
    else:
        print(f"rlzoo: resuming {run_dir} from its config.yaml, unchanged", flush=True)
    return cfg, info


def record_resume(info: ResumeInfo, *, from_step: int, moved: Sequence[Path] = ()) -> Path:
    """Append this resume (command-line overrides, what they changed, the checkpoint step the
    branch starts from, where the abandoned branch's files went) to ``resumes.yaml``.

    Called once the checkpoint has loaded: a resume that failed before that is not recorded."""
    import yaml

    path = info.run_dir / "resumes.yaml"
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "pid": os.getpid(),
        "overrides": list(info.overrides),
        "changes": {k: {"from": old, "to": new} for k, (old, new) in info.changes.items()},
        "from_step": int(from_step),
        "moved_aside": [p.name for p in moved],
    }
    text = yaml.safe_dump([entry], sort_keys=False, default_flow_style=False)
    with open(path, "a") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    return path


# ---------------------------------------------------------------------------------------------
# Whose directory is it
# ---------------------------------------------------------------------------------------------
def require_existing_run_dir(run_dir: Path) -> None:
    """A resume needs its run directory: a missing one is an error (never created)."""
    if run_dir.is_dir():
        return
    from rlzoo.kernel.errors import closest

    parent = run_dir.parent
    near = closest(run_dir.name, [p.name for p in parent.iterdir() if p.is_dir()]) if parent.is_dir() else []
    hint = f" Did you mean: {', '.join(str(parent / n) for n in near)}?" if near else ""
    raise ConfigError(
        [f"run.output_dir: {run_dir} does not exist, so there is no run to resume.{hint}"],
        header="cannot resume",
    )


def _taken(path: Path) -> str:
    """The heading of a refusal to start a run in ``path``: the run directory's state, not the recipe."""
    return f"cannot start a run in {path} (the run directory)"


def claim_run_dir(path: Path, *, resume: bool, overwrite: bool, resume_command: str) -> tuple[Path, Any]:
    """Create or reuse ``path`` for this run; returns (the resolved directory, its held lock).

    A resume needs an existing directory. A fresh run takes a new or empty directory (or one whose
    run stopped before writing anything but its settings); a directory that holds a run is refused
    with ``resume_command``, or with ``overwrite`` moved aside to ``PATH.replaced-<time>``. A
    non-empty folder that is not a run directory is refused even with ``overwrite``.
    """
    from rlzoo.train.checkpoint import RunLock

    path = path.expanduser()
    if resume:
        require_existing_run_dir(path)
        return path.resolve(), RunLock(path).acquire()
    if path.exists() and not path.is_dir():
        raise ConfigError([f"run.output_dir: {path} is a file, not a folder"], header=_taken(path))
    if not path.exists():
        path.mkdir(parents=True)
        return path.resolve(), RunLock(path).acquire()
    entries = sorted(p.name for p in path.iterdir())
    is_run = bool({LOCK_FILE, *_SETTINGS} & set(entries))
    if set(entries) <= _BOOKKEEPING:
        return path.resolve(), RunLock(path).acquire()
    if not is_run:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise ConfigError(
            [
                f"run.output_dir: {path} is not empty ({shown}) and is not an rlzoo run directory; "
                "a run writes only into a new or empty folder. Choose another run.output_dir"
            ],
            header=_taken(path),
        )
    lock = RunLock(path).acquire()  # nobody is writing into it (else: RunDirLocked names the PID)
    if not overwrite:
        lock.release()
        raise ConfigError(
            [
                f"run.output_dir: {path} already holds a run ({', '.join(entries[:6])}); a fresh run "
                f"would mix its steps and checkpoints into it. Continue that run with:\n  {resume_command}\n"
                "or choose another run.output_dir, or set run.overwrite=true to move the old run aside "
                f"(to {path.name}.replaced-<time>; nothing is deleted)"
            ],
            header=_taken(path),
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.replaced-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.replaced-{stamp}-{n}")
    path.rename(aside)  # the lock file moves with it; we still hold it
    try:
        path.mkdir()
        new_lock = RunLock(path).acquire()
    finally:
        lock.release()
    print(f"rlzoo: run.overwrite: moved the previous run in {path} to {aside}", flush=True)
    return path.resolve(), new_lock
