"""Part selections on the command line: switching a part by name keeps its declared params.

:func:`rlzoo.recipe.config.compose_recipe` hands Hydra every override except those of part selections
(``algorithm.advantage=rloo``, ``trainer.backend.lr=...``, ``'algorithm.advantage={name: gae}'``),
which :func:`apply_part_overrides` applies to the composed config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlzoo.kernel.binding import field_types
from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.types import RecipeConfig

__all__ = [
    "PartOverride",
    "apply_part_overrides",
    "part_paths",
    "split_part_overrides",
    "unreadable_overrides",
]


def part_paths() -> dict[str, str]:
    """Config path -> kind of every single-part selection of :class:`RecipeConfig`."""
    out: dict[str, str] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = field_types(cls)
        for f in dataclasses.fields(cls):
            path = f"{prefix}{f.name}"
            kind = f.metadata.get("kind")
            if kind is not None:
                if not f.metadata.get("mapping") and not f.metadata.get("sequence"):
                    out[path] = kind
                continue
            tp = hints.get(f.name)
            if dataclasses.is_dataclass(tp) and isinstance(tp, type):
                walk(tp, path + ".")

    walk(RecipeConfig, "")
    return out


@dataclass(frozen=True)
class PartOverride:
    """A command-line override of a part selection: ``path=value`` or ``path.sub=value``."""

    path: str  # the part's config path (``trainer.backend``)
    sub: str | None  # the key below it (``lr``, ``name``), None for the whole entry
    value: Any
    line: str


def split_part_overrides(overrides: Sequence[str]) -> tuple[list[PartOverride], list[str]]:
    """(overrides of part selections, the rest). Deletions (``~``) and Hydra's own keys stay with
    the rest; so does any line the override grammar cannot read (Hydra reports it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    paths = part_paths()
    parser = OverridesParser.create()
    parts: list[PartOverride] = []
    rest: list[str] = []
    for line in overrides:
        try:
            (o,) = parser.parse_overrides([line])
        except Exception:
            rest.append(line)
            continue
        key = o.key_or_group
        if o.type == OverrideType.DEL or o.package is not None or o.is_sweep_override():
            rest.append(line)
            continue
        match = next(
            (p for p in sorted(paths, key=len, reverse=True) if key == p or key.startswith(p + ".")), None
        )
        if match is None:
            rest.append(line)
            continue
        sub = key[len(match) + 1 :] or None
        parts.append(PartOverride(match, sub, o.value(), line))
    return parts, rest


def unreadable_overrides(overrides: Sequence[str]) -> list[str]:
    """One problem per line Hydra's override grammar cannot read (what ``rlzoo train`` refuses), with
    the grammar's own message and how to write such a value: a line is never merged as a guess."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    problems = []
    for line in overrides:
        try:
            parser.parse_overrides([line])
        except Exception as exc:
            why = " ".join(str(exc).split())
            problems.append(
                f"override {line!r}: the override grammar cannot read it ({why}); put a value that holds "
                "'~', spaces or other special characters in quotes: data.dir='~/x', runner={name: sft, files: ['~/x']}"
            )
    return problems


def _plain(node: Any) -> Any:
    from omegaconf import OmegaConf

    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=False)
    return node


def apply_part_overrides(cfg: Any, overrides: Sequence[PartOverride], pm: PluginManager) -> None:
    """Apply part overrides to a composed OmegaConf config, in order.

    ``path=NAME`` and ``path.name=NAME`` switch the part: every param of the old selection that
    the new part also declares is kept, the others are dropped and the switch is printed (stderr).
    ``path={name: NAME, k: v}`` switches the same way and then sets the given params; a mapping
    without ``name`` updates the params of the current part. ``path.k=v`` sets one param of the
    current part (a part written as a bare name in the recipe becomes ``{name: ..., k: v}``).
    """
    import sys

    from omegaconf import OmegaConf

    paths = part_paths()
    OmegaConf.set_struct(cfg, False)
    for o in overrides:
        current = _plain(OmegaConf.select(cfg, o.path, default=None))
        if isinstance(current, str):
            current = {"name": current}
        if not isinstance(current, dict):
            current = {}
        old_name = current.get("name")
        value = _plain(o.value)
        if o.sub is None and (value is None or value == "none" or not isinstance(value, (str, dict))):
            OmegaConf.update(cfg, o.path, value, merge=False)  # off, or a wrong type binding reports
            continue
        new_name: Any
        given: dict[str, Any] | None
        if o.sub is None and isinstance(value, str):
            new_name, given = value, {}
        elif o.sub is None:
            new_name = value.get("name", old_name)
            given = {k: v for k, v in value.items() if k != "name"}
        elif o.sub == "name":
            new_name, given = value, {}
        else:
            new_name, given = old_name, None
        params = {k: v for k, v in current.items() if k != "name"}
        if isinstance(new_name, str) and isinstance(old_name, str) and new_name != old_name:
            params = _keep_declared(paths[o.path], o.path, old_name, new_name, params, pm, sys.stderr)
        node: dict[str, Any] = {"name": new_name, **params} if new_name is not None else dict(params)
        merged = OmegaConf.create(node)
        if given is None:
            OmegaConf.update(merged, o.sub, value, merge=False)  # type: ignore[arg-type]
        else:
            for k, v in given.items():
                OmegaConf.update(merged, k, v, merge=False)
        OmegaConf.update(cfg, o.path, merged, merge=False)


def _keep_declared(
    kind: str, path: str, old: str, new: str, params: Mapping[str, Any], pm: PluginManager, out: Any
) -> dict[str, Any]:
    """The params of ``old`` that part ``new`` also declares; prints the switch and what it dropped."""
    registry = pm.registry(kind)
    if new not in registry:
        return dict(params)  # binding reports the unknown name (with the registered choices)
    comp = registry.get(new)
    declared = {f.name for f in dataclasses.fields(comp.params)} if comp.params is not None else set()
    kept = {k: v for k, v in params.items() if k in declared}
    dropped = sorted(k for k in params if k not in declared)
    if params:
        msg = f"rlzoo: {path}: {old} -> {new}"
        if kept:
            msg += f"; kept {', '.join(sorted(kept))}"
        if dropped:
            msg += f"; dropped {', '.join(dropped)} ({kind} {new!r} does not declare them)"
        print(msg, file=out, flush=True)
    return kept
