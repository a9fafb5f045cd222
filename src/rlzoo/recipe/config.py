"""Recipes: Hydra YAML that selects parts by name, bound onto typed sections.

A recipe is found by name on the search path (the working directory's ``recipes/``, paths that
plugins add through ``rlzoo_recipe_search_paths``, rlzoo's own recipes) or given as a file path.
Hydra composes it with command-line overrides (``key=value``, ``+key=value``, ``~key``). Then
:func:`bind_config` binds every section onto its dataclass, resolves every part name in its
registry and binds each part's params, and raises one :class:`ConfigError` listing every problem
with its key path. Nothing heavy (no model, no dataset) is touched.

A part selection is written as a name or as a mapping with ``name`` plus the part's params::

    algorithm:
      advantage: grpo                 # same as {name: grpo}
      policy_loss:
        name: ppo_clip
        clip_ratio_high: 0.28

On the command line (:func:`apply_part_overrides`): ``algorithm.advantage=rloo`` switches the part,
keeping the params the new part also declares and printing the ones it drops;
``'algorithm.advantage={name: gae, lam: 0.9}'`` switches and sets params; ``algorithm.advantage.lam=0.9``
or ``'algorithm.advantage={lam: 0.9}'`` set params of the current part.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rlzoo.kernel.binding import bind_dataclass, field_types, to_plain
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.plugins import PluginManager, get_plugin_manager
from rlzoo.kernel.settings import OptimSettings
from rlzoo.recipe.checks import all_range_problems, check_consistency, check_notices
from rlzoo.recipe.files import find_recipe, notice_shadowing, recipe_search_paths
from rlzoo.recipe.overrides import apply_part_overrides, split_part_overrides, unreadable_overrides
from rlzoo.recipe.types import RecipeConfig, Selection


# ---------------------------------------------------------------------------------------------
# Binding
# ---------------------------------------------------------------------------------------------
def bind_part(
    kind: str,
    value: Any,
    key: str,
    problems: list[str],
    pm: PluginManager,
    *,
    optional: bool = False,
) -> Selection | None:
    """Resolve one part selection (a name, or a mapping with ``name`` and params)."""
    if isinstance(value, Selection):
        return value
    if value is None or (value == "none" and optional and "none" not in pm.registry(kind)):
        if not optional:
            problems.append(f"{key}: a {kind} is required (set {key}.name)")
        return None
    if isinstance(value, str):
        name, raw_params = value, {}
    elif isinstance(value, Mapping):
        raw_params = {k: v for k, v in value.items() if k != "name"}
        got = value.get("name")
        if not isinstance(got, str):
            problems.append(f"{key}.name: missing; name one of: {', '.join(pm.registry(kind).names())}")
            return None
        name = got
    else:
        problems.append(f"{key}: expected a {kind} name or a mapping with 'name', got {value!r}")
        return None
    registry = pm.registry(kind)
    if name not in registry:
        problems.append(f"{key}.name: {registry.unknown_message(name, key=key + '.name')}")
        return None
    comp = registry.get(name)
    if comp.params is None:
        if raw_params:
            hints = "".join(
                _unknown_param_hint(kind, key, name, str(k), registry) for k in sorted(raw_params)
            )
            problems.append(
                f"{key}: {kind} {name!r} takes no params, got {', '.join(sorted(raw_params))}{hints}"
            )
        return Selection(kind, key, comp.name, comp, None)
    before = len(problems)
    bound = bind_dataclass(comp.params, raw_params, key, problems, what=f"{kind} {name!r}")
    declared = {f.name for f in dataclasses.fields(comp.params)}
    for k in raw_params:
        if k in declared:
            continue
        hint = _unknown_param_hint(kind, key, name, str(k), registry)
        for i in range(before, len(problems)):
            if hint and problems[i].startswith(f"{key}.{k}: unknown key"):
                problems[i] += hint
    return Selection(kind, key, comp.name, comp, bound)


#: Backend params that became trainer settings shared by every train backend (old name -> new key).
MOVED_TO_TRAINER: Mapping[str, str] = {
    **{f.name: f"trainer.optim.{f.name}" for f in dataclasses.fields(OptimSettings)},
    "micro_batch_size": "trainer.micro_batch.size",
    "max_tokens_per_micro_batch": "trainer.micro_batch.max_tokens",
    "log_prob_micro_batch_size": "trainer.micro_batch.log_prob_size",
}


def _unknown_param_hint(kind: str, key: str, name: str, param_name: str, registry: Any) -> str:
    """Where an unknown param of part ``name`` does exist: a trainer setting, or other parts."""
    if kind == "train_backend" and param_name in MOVED_TO_TRAINER:
        return (
            f" ({param_name} is a trainer setting shared by every train backend: "
            f"set {MOVED_TO_TRAINER[param_name]})"
        )
    others = [
        c.name
        for c in registry
        if c.name != name
        and c.params is not None
        and param_name in {f.name for f in dataclasses.fields(c.params)}
    ]
    if not others:
        return ""
    return (
        f" ({param_name} is a param of {kind} {', '.join(repr(o) for o in others)}; "
        f"select one with {key}={others[0]} {key}.{param_name}=...)"
    )


def _custom_binder(pm: PluginManager) -> Any:
    def custom(f: dataclasses.Field[Any], value: Any, path: str, problems: list[str]) -> Any:
        kind = f.metadata.get("kind")
        if kind is None:
            hint = field_types_cache.get(f.type)  # nested dataclass sections
            if hint is not None:
                return bind_dataclass(hint, value or {}, path, problems, custom=custom)
            return NotImplemented
        if f.metadata.get("sequence"):
            return _bind_sequence(kind, value, path, problems, pm)
        if f.metadata.get("mapping"):
            if not isinstance(value, Mapping):
                problems.append(f"{path}: expected a mapping of data_source -> {kind}")
                return {}
            return {k: bind_part(kind, v, f"{path}.{k}", problems, pm) for k, v in value.items()}
        return bind_part(kind, value, path, problems, pm, optional=f.metadata.get("optional", False))

    return custom


def _bind_sequence(kind: str, value: Any, path: str, problems: list[str], pm: PluginManager) -> list[Any]:
    """A list of part selections (``run.loggers``): each entry bound like a single part."""
    if isinstance(value, (str, Mapping)) or not isinstance(value, (list, tuple)):
        problems.append(f"{path}: expected a list of {kind} names, e.g. [console, jsonl], got {value!r}")
        return []
    bound = [bind_part(kind, v, f"{path}[{i}]", problems, pm) for i, v in enumerate(value)]
    return [b for b in bound if b is not None]


field_types_cache: dict[Any, type] = {}


def _register_sections(cls: type) -> None:
    for name, tp in field_types(cls).items():
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            field_types_cache[tp] = tp
            field_types_cache[tp.__name__] = tp
            _register_sections(tp)
        del name


_register_sections(RecipeConfig)


def bind_config(raw: Mapping[str, Any], pm: PluginManager | None = None) -> RecipeConfig:
    """Bind a composed recipe (plain mapping) onto :class:`RecipeConfig`; one error lists all problems."""
    pm = pm or get_plugin_manager()
    problems: list[str] = []
    custom = _custom_binder(pm)
    raw = dict(raw)
    raw.pop("hydra", None)
    saved_as = raw.pop(ENV_KEY, None) or {}
    cfg = bind_dataclass(RecipeConfig, raw, "", problems, what="the recipe", custom=custom)
    probe = cfg
    if cfg is None and _missing_required(RecipeConfig, raw):
        # a required section is missing (reported above): bind again with placeholders for it, so
        # that the rest of the recipe is checked in this same report, not in a second round
        probe = bind_dataclass(RecipeConfig, _with_placeholders(RecipeConfig, raw), "", [], custom=custom)
    # defaults that were not given in the recipe are still mappings: resolve them too
    if probe is not None:
        _resolve_defaults(probe, "", problems if cfg is not None else [], pm)
        # ranges and cross-field rules too, in the same report: a rule whose inputs failed to
        # bind is skipped (their problem is already listed)

        problems += all_range_problems(probe)
        problems += check_consistency(probe)
        if not problems:
            for note in check_notices(probe):
                print(f"rlzoo: note: {note}", file=sys.stderr, flush=True)
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    cfg.saved_as = dict(saved_as)
    return cfg  # type: ignore[no-any-return]


def _missing_required(cls: type, raw: Mapping[str, Any]) -> bool:
    return any(
        f.name not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for f in dataclasses.fields(cls)
        if f.init
    )


def _with_placeholders(cls: type, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with every missing required field filled by a placeholder (a nested dataclass's own
    required fields too): only to run the remaining checks of a recipe already known to be invalid."""
    out = dict(raw)
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        value = out.get(f.name)
        typ = hints.get(f.name)
        if isinstance(typ, type) and dataclasses.is_dataclass(typ):
            out[f.name] = _with_placeholders(typ, value if isinstance(value, Mapping) else {})
        elif f.name not in out:
            out[f.name] = "<missing>"
    return out


def _resolve_defaults(obj: Any, path: str, problems: list[str], pm: PluginManager) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        sub = f"{path}.{f.name}" if path else f.name
        kind = f.metadata.get("kind")
        if kind is not None and f.metadata.get("sequence"):
            if any(isinstance(v, (str, Mapping)) for v in value or ()):  # a default never bound
                setattr(obj, f.name, _bind_sequence(kind, value, sub, problems, pm))
        elif kind is not None and not f.metadata.get("mapping"):
            if isinstance(value, (str, Mapping)):  # a default never bound (None: failed or off)
                setattr(
                    obj,
                    f.name,
                    bind_part(kind, value, sub, problems, pm, optional=f.metadata.get("optional", False)),
                )
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            _resolve_defaults(value, sub, problems, pm)


# ---------------------------------------------------------------------------------------------
# Recipe loading (Hydra)
# ---------------------------------------------------------------------------------------------
def compose_recipe(
    name: str, overrides: Sequence[str] = (), pm: PluginManager | None = None
) -> dict[str, Any]:
    """Compose a recipe with Hydra and return it as a resolved plain mapping."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    pm = pm or get_plugin_manager()
    path = find_recipe(name, pm)
    notice_shadowing(name, path, pm)
    search = [d for d in recipe_search_paths(pm) if d.is_dir() and d != path.parent]
    # part selections (`algorithm.advantage=rloo`, `trainer.backend.lr=...`) are applied after
    # composition, by switch_part(); everything else goes to Hydra.
    part_ovr, rest = split_part_overrides(overrides)
    # `key=value` may set any key the typed sections know, present in the recipe or not: force-add
    # it (`++`) and let bind_config report keys that do not exist, with a did-you-mean.
    ovr = [o if o.startswith(("+", "~", "hydra.")) or "=" not in o else "++" + o for o in rest]
    if search:
        ovr.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in search) + "]")
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(path.parent), version_base=None):
            cfg = compose(config_name=path.stem, overrides=ovr)
    except Exception as exc:
        raise ConfigError([_chain(exc)], header=f"cannot compose recipe {name!r} ({path})") from exc
    apply_part_overrides(cfg, part_ovr, pm)
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:
        raise ConfigError([f"{type(exc).__name__}: {exc}"], header=f"cannot resolve recipe {name!r}") from exc
    assert isinstance(plain, dict)
    plain.pop("hydra", None)
    plain.setdefault("recipe", path.stem)
    plain[ENV_KEY] = _env_literals(cfg, plain)
    return plain  # type: ignore[return-value]


#: key of :func:`compose_recipe`'s mapping under which the settings whose value came from an
#: environment variable (``${oc.env:VAR}``) keep their unresolved form (:attr:`RecipeConfig.saved_as`)
ENV_KEY = "__saved_as__"
_OC_ENV = re.compile(r"\$\{\s*oc\.env:")
_LITERAL = "rlzoo.env_literal"


def _env_literal(key: str, default: Any = None, *rest: Any) -> str:
    """What ``${oc.env:key[,default]}`` is written as in a saved file: itself, unresolved."""
    if default is None and not rest:
        return "${oc.env:" + key + "}"
    quoted = "'" + str(default).replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "${oc.env:" + key + "," + quoted + "}"


def _env_literals(cfg: Any, resolved: Mapping[Any, Any]) -> dict[str, Any]:
    """``{dotted key: value with every ${oc.env:VAR} left unresolved}`` for each setting whose
    resolved value an environment variable made (directly or through another interpolation)."""
    from omegaconf import OmegaConf

    def rewrite(node: Any) -> Any:
        if isinstance(node, str):
            return _OC_ENV.sub("${" + _LITERAL + ":", node)
        if isinstance(node, Mapping):
            return {k: rewrite(v) for k, v in node.items()}
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    raw = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    if not _OC_ENV.search(repr(raw)):
        return {}
    if not OmegaConf.has_resolver(_LITERAL):
        OmegaConf.register_new_resolver(_LITERAL, _env_literal)
    try:
        literal = OmegaConf.to_container(OmegaConf.create(rewrite(raw)), resolve=True)
    except Exception:  # resolved once already: an interpolation only the real resolver takes
        return {}
    values = _leaves(resolved)
    return {k: v for k, v in _leaves(literal).items() if values.get(k) != v}


def _leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every leaf of nested mappings (a list is a leaf)."""
    if not isinstance(d, Mapping):
        return {prefix[:-1]: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}{k}."))
    return out


def _chain(exc: BaseException) -> str:
    """An exception and its causes in one line (Hydra wraps the useful message)."""
    parts = []
    e: BaseException | None = exc
    while e is not None:
        text = str(e).strip()
        if text:
            parts.append(f"{type(e).__name__}: {text}")
        e = e.__cause__ or e.__context__
    return " <- ".join(parts) or type(exc).__name__


def load_config(
    recipe: str | Mapping[str, Any] | RecipeConfig = "quickstart",
    overrides: Sequence[str] = (),
    pm: PluginManager | None = None,
) -> RecipeConfig:
    """Recipe name / path / mapping / bound config -> validated :class:`RecipeConfig`."""
    pm = pm or get_plugin_manager()
    if isinstance(recipe, RecipeConfig):
        if overrides:
            raw = apply_overrides(recipe.to_dict(), overrides, pm)
            return bind_config(raw, pm)
        return recipe
    if isinstance(recipe, Mapping):
        raw = apply_overrides(dict(recipe), overrides, pm) if overrides else dict(recipe)
        return bind_config(raw, pm)
    return bind_config(compose_recipe(recipe, overrides, pm), pm)


def strip_plugin_notes(obj: Any) -> Any:
    """A saved config (:meth:`RecipeConfig.to_dict`) records each part's plugin; binding takes only
    ``name`` + params."""
    if isinstance(obj, Mapping):
        return {k: strip_plugin_notes(v) for k, v in obj.items() if not (k == "plugin" and "name" in obj)}
    if isinstance(obj, list):
        return [strip_plugin_notes(v) for v in obj]
    return obj


def apply_overrides(
    raw: Mapping[str, Any], overrides: Sequence[str], pm: PluginManager | None = None
) -> dict[str, Any]:
    """Apply ``key=value`` overrides to a plain mapping (OmegaConf dotlist semantics; part
    selections as :func:`apply_part_overrides` does)."""
    from omegaconf import OmegaConf

    problems = unreadable_overrides(overrides)
    if problems:
        raise ConfigError(problems, header="overrides")
    part_ovr, overrides = split_part_overrides(overrides)
    base = OmegaConf.create(to_plain(dict(raw)))
    dot = [o.lstrip("+") for o in overrides if not o.startswith("~")]
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist(dot))
    apply_part_overrides(merged, part_ovr, pm or get_plugin_manager())
    for o in overrides:
        if o.startswith("~"):
            parent, _, leaf = o[1:].rpartition(".")
            node = OmegaConf.select(merged, parent) if parent else merged
            if node is not None and leaf in node:
                del node[leaf]  # type: ignore[arg-type]
    out = OmegaConf.to_container(merged, resolve=True)
    assert isinstance(out, dict)
    return out  # type: ignore[return-value]


__all__ = [
    "apply_overrides",
    "bind_config",
    "bind_part",
    "compose_recipe",
    "load_config",
    "strip_plugin_notes",
]
