"""Exact resume: the run directory's saved ``config.yaml`` is the source of truth.

``rlzoo train RECIPE resume=latest run.output_dir=DIR [overrides]`` reloads ``DIR/config.yaml``
(everything the run was started with, its command-line overrides included) and applies only the
overrides given now. The changes are printed as a diff and appended to ``DIR/resumes.yaml``;
``config.yaml`` is never rewritten. A directory without a saved config (e.g. a copied checkpoint)
resumes from the recipe and overrides given, and says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlzoo.config import RecipeConfig, load_config

#: overrides that say where and whether to resume; never recorded as changes of the run
_RESUME_KEYS = ("resume", "run.output_dir")


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


def _strip_plugin(obj: Any) -> Any:
    """A saved config records each part's plugin; binding takes only ``name`` + params."""
    if isinstance(obj, Mapping):
        return {k: _strip_plugin(v) for k, v in obj.items() if not (k == "plugin" and "name" in obj)}
    if isinstance(obj, list):
        return [_strip_plugin(v) for v in obj]
    return obj


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


def load_resumed(overrides: Sequence[str], pm: Any) -> tuple[RecipeConfig, ResumeInfo] | None:
    """The config of a resume: the saved one plus ``overrides``; None when this is no resume or
    the run directory has no saved ``config.yaml``."""
    resume, out = resume_request(overrides)
    if not resume or not out:
        return None
    run_dir = Path(out).expanduser()
    saved_file = run_dir / "config.yaml"
    if not saved_file.is_file():
        if run_dir.exists():
            print(
                f"rlzoo: resume: {run_dir} has no saved config.yaml; using the recipe and overrides given",
                flush=True,
            )
        return None
    import yaml

    saved = _strip_plugin(yaml.safe_load(saved_file.read_text()) or {})
    base = load_config(saved, [], pm)
    raw = _apply(_strip_plugin(base.to_dict()), list(overrides))
    cfg = load_config(raw, [], pm)
    info = ResumeInfo(run_dir.resolve(), list(overrides), diff(base.to_dict(), cfg.to_dict()))
    if info.changes:
        lines = "\n".join(f"  {k}: {old!r} -> {new!r}" for k, (old, new) in info.changes.items())
        print(f"rlzoo: resuming {run_dir} from its config.yaml with these changes:\n{lines}", flush=True)
    else:
        print(f"rlzoo: resuming {run_dir} from its config.yaml, unchanged", flush=True)
    return cfg, info


def record_resume(info: ResumeInfo) -> Path:
    """Append this resume (command-line overrides and what they changed) to ``resumes.yaml``."""
    import yaml

    path = info.run_dir / "resumes.yaml"
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "pid": os.getpid(),
        "overrides": list(info.overrides),
        "changes": {k: {"from": old, "to": new} for k, (old, new) in info.changes.items()},
    }
    with open(path, "a") as fh:
        fh.write(yaml.safe_dump([entry], sort_keys=False, default_flow_style=False))
    return path
