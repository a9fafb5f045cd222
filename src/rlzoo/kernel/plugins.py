"""The plugin manager: loads built-in and third-party plugins and builds the registries.

Built-ins are ordinary plugins, listed in :data:`BUILTIN_PLUGINS` and registered through exactly
the hooks a third party uses. Third parties are found in the ``rlzoo`` entry-point group.

Environment variables:

``RLZOO_PLUGINS``
    Comma-separated allow-list of third-party plugins (entry-point names or distribution names).
    When set, every other third-party plugin is blocked (listed as ``blocked`` by
    ``rlzoo plugins --all``). Set it to an empty string to block all of them.
``RLZOO_DISABLE_PLUGIN_AUTOLOAD``
    ``1`` / ``true``: load no third-party plugin from entry points at all (built-ins still load).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.metadata as md
import inspect
import os
import types
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import pluggy

import rlzoo.kernel.hookspecs as hookspecs
from rlzoo.kernel.errors import DuplicateComponentError, PluginError
from rlzoo.kernel.kinds import KINDS
from rlzoo.kernel.registry import Component, Registrar, Registry

ENTRY_POINT_GROUP = "rlzoo"
ENV_ALLOW = "RLZOO_PLUGINS"
ENV_NO_AUTOLOAD = "RLZOO_DISABLE_PLUGIN_AUTOLOAD"

#: The built-in plugins, in load order. Each is an import-light module with hookimpls.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "rlzoo.algorithms.advantage",
    "rlzoo.algorithms.policy_loss",
    "rlzoo.algorithms.loss_agg",
    "rlzoo.algorithms.kl",
    "rlzoo.algorithms.correction",
    "rlzoo.algorithms.filters",
    "rlzoo.algorithms.scorers",
    "rlzoo.algorithms.reward",
    "rlzoo.algorithms.reward_model",
    "rlzoo.algorithms.judge",
    "rlzoo.algorithms.distill",
    "rlzoo.tasks.datasets",
    "rlzoo.backends.native",
    "rlzoo.backends.fsdp2",
    "rlzoo.backends.vllm",
    "rlzoo.backends.megatron",
    "rlzoo.sources",
    "rlzoo.loggers",
    "rlzoo.tasks.quickstart",
    "rlzoo.tasks.tools",
    "rlzoo.tasks.agents",
    "rlzoo.tasks.python_functions",
    "rlzoo.tasks.smollm2",
    "rlzoo.tasks.smollm2_calc",
    "rlzoo.tasks.reasoning_gym",
    "rlzoo.tasks.textarena",
    "rlzoo.backends.simulated",
    "rlzoo.recipes",
)


class PluginLoadWarning(UserWarning):
    """A third-party plugin failed to import; the others still load."""


@dataclass
class PluginInfo:
    """What ``rlzoo plugins`` reports about one plugin."""

    name: str
    version: str
    source: str  # "builtin" or "entry point <group>:<name> (<dist>)"
    status: str  # "loaded", "blocked", "failed", "disabled"
    builtin: bool
    distribution: str | None = None
    hooks: list[str] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)  # "kind:name"
    error: str | None = None

    @property
    def from_entry_point(self) -> bool:
        """Loaded from an installed package's entry point (not a built-in, not registered at run time)."""
        return self.source.startswith("entry point")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _rlzoo_version() -> str:
    try:
        return md.version("rlzoo")
    except md.PackageNotFoundError:  # running from a source tree
        from rlzoo.version import __version__

        return __version__


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in {"1", "true", "yes", "on"}


class PluginManager:
    """A typed facade over :class:`pluggy.PluginManager` that builds one registry per kind."""

    def __init__(
        self,
        *,
        builtins: Iterable[str] = BUILTIN_PLUGINS,
        load_entrypoints: bool | None = None,
        allow: Iterable[str] | None = None,
    ) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._info: dict[str, PluginInfo] = {}
        self._originals: dict[str, object] = {}  # name -> the plugin object as given
        self._registries: dict[str, Registry[Any]] | None = None
        version = _rlzoo_version()
        for modname in builtins:
            module = importlib.import_module(modname)
            self._register(module, modname, PluginInfo(modname, version, "builtin", "loaded", True))
        if load_entrypoints is None:
            load_entrypoints = not _truthy(os.environ.get(ENV_NO_AUTOLOAD))
        if allow is None and ENV_ALLOW in os.environ:
            allow = [a.strip() for a in os.environ[ENV_ALLOW].split(",") if a.strip()]
        self._allow = None if allow is None else set(allow)
        if load_entrypoints:
            self._load_entrypoints()
        else:
            for ep in md.entry_points(group=ENTRY_POINT_GROUP):
                dist = ep.dist.name if ep.dist else None
                self._info[ep.name] = PluginInfo(
                    ep.name,
                    ep.dist.version if ep.dist else "?",
                    f"entry point {ENTRY_POINT_GROUP}:{ep.name} ({dist})",
                    "disabled",
                    False,
                    dist,
                    error=f"{ENV_NO_AUTOLOAD} is set",
                )
        self.check_pending()

    # -- loading --------------------------------------------------------------------------------
    def _load_entrypoints(self) -> None:
        seen: set[str] = set()
        for ep in md.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in seen:
                continue
            seen.add(ep.name)
            dist = ep.dist.name if ep.dist else None
            info = PluginInfo(
                ep.name,
                ep.dist.version if ep.dist else "?",
                f"entry point {ENTRY_POINT_GROUP}:{ep.name} ({dist})",
                "loaded",
                False,
                dist,
            )
            if self._allow is not None and ep.name not in self._allow and dist not in self._allow:
                info.status = "blocked"
                info.error = f"not in {ENV_ALLOW}={','.join(sorted(self._allow))}"
                self._info[ep.name] = info
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not take the others down
                info.status = "failed"
                info.error = f"{type(exc).__name__}: {exc}"
                self._info[ep.name] = info
                warnings.warn(
                    f"rlzoo plugin {ep.name!r} (from {dist or ep.value}) failed to import and was "
                    f"skipped: {info.error}",
                    PluginLoadWarning,
                    stacklevel=2,
                )
                continue
            self._register(plugin, ep.name, info)
            try:
                self.check_pending()
            except PluginError as exc:  # a misspelt hook: skip this plugin, keep the others
                self._pm.unregister(name=ep.name)
                self._originals.pop(ep.name, None)
                info.status, info.error, info.hooks = "failed", str(exc), []
                warnings.warn(
                    f"rlzoo plugin {ep.name!r} (from {dist or ep.value}) was skipped: {exc}",
                    PluginLoadWarning,
                    stacklevel=2,
                )

    def _register(self, plugin: object, name: str, info: PluginInfo) -> None:
        if any(original is plugin for original in self._originals.values()):
            raise PluginError(f"plugin {name!r} could not be registered: it is already registered")
        try:
            self._pm.register(_attributed_plugin(plugin, name), name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name!r}: {exc}") from exc
        except ValueError as exc:
            raise PluginError(f"plugin {name!r} could not be registered: {exc}") from exc
        self._originals[name] = plugin
        info.hooks = sorted(
            impl.name
            for impl in self._pm.get_hookcallers(self._pm.get_plugin(name)) or []  # type: ignore[union-attr]
        )
        self._info[name] = info
        self._registries = None

    def register(self, plugin: object, name: str | None = None, *, version: str = "0") -> str:
        """Register a plugin object at run time (tests, notebooks). Returns its name."""
        name = name or getattr(plugin, "__name__", None) or f"plugin-{id(plugin)}"
        self._register(plugin, name, PluginInfo(name, version, "registered at run time", "loaded", False))
        try:
            self.check_pending()
        except PluginError:  # a misspelt hook: leave the manager as it was
            self.unregister(name)
            raise
        return name

    def unregister(self, name: str) -> None:
        self._pm.unregister(name=name)
        self._originals.pop(name, None)
        self._info.pop(name, None)
        self._registries = None

    def check_pending(self) -> None:
        """Fail if a plugin implements a hook that does not exist (a misspelt hook name).

        pluggy's ``check_pending`` finds it; the error names the plugin, the hook and the closest
        known hook.
        """
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            from rlzoo.kernel.errors import did_you_mean

            known = sorted(k for k in dir(hookspecs) if k.startswith("rlzoo_"))
            hook = _unknown_hook(self._pm, known)
            hint = did_you_mean(hook, known) if hook else ""
            plugin = exc.plugin if isinstance(exc.plugin, str) else self._pm.get_name(exc.plugin)
            raise PluginError(
                f"plugin {plugin!r} implements unknown hook {hook!r}{hint} Known hooks: {', '.join(known)}"
            ) from exc

    # -- registries -----------------------------------------------------------------------------
    def registries(self) -> dict[str, Registry[Any]]:
        """One registry per kind, built by calling every plugin's register hooks.

        A name that an entry-point plugin registers twice, or that clashes with another plugin's,
        skips that plugin (status ``failed``, the clash as its error, a :class:`PluginLoadWarning`)
        and the registries are built without it: one plugin's mistake does not make every command
        fatal, and ``rlzoo plugins`` names the clash. A clash among built-ins or plugins registered
        at run time (:meth:`register`) is raised.
        """
        while True:
            try:
                return self._build_registries()
            except DuplicateComponentError as exc:
                culprit = next(
                    (
                        p
                        for p in reversed(exc.plugins)
                        if self._info.get(p) and self._info[p].from_entry_point
                    ),
                    None,
                )
                if culprit is None:
                    raise
                info = self._info[culprit]
                self._pm.unregister(name=culprit)
                self._originals.pop(culprit, None)
                info.status, info.error, info.hooks = "failed", str(exc), []
                self._registries = None
                warnings.warn(
                    f"rlzoo plugin {culprit!r} ({info.source}) was skipped: {exc}",
                    PluginLoadWarning,
                    stacklevel=2,
                )

    def _build_registries(self) -> dict[str, Registry[Any]]:
        if self._registries is None:
            regs: dict[str, Registry[Any]] = {}
            for kind in KINDS:
                reg: Registry[Any] = Registry(kind.name)
                caller = getattr(self._pm.hook, kind.hook)
                try:
                    caller(registry=HookRegistrar(reg))  # pluggy's caller: order, wrappers
                except PluginError:
                    raise
                except Exception as exc:
                    plugin = getattr(exc, _FAILED_IN, "?")
                    raise PluginError(
                        f"plugin {plugin!r} failed in hook {kind.hook}: {type(exc).__name__}: {exc}"
                    ) from exc
                regs[kind.name] = reg
            self._registries = regs
            for info in self._info.values():
                info.parts = []
            for reg in regs.values():
                for comp in reg:
                    if comp.plugin in self._info:
                        self._info[comp.plugin].parts.append(f"{comp.kind}:{comp.name}")
        return self._registries

    def registry(self, kind: str) -> Registry[Any]:
        regs = self.registries()
        if kind not in regs:
            raise KeyError(f"unknown kind {kind!r}; kinds are {', '.join(sorted(regs))}")
        return regs[kind]

    def get(self, kind: str, name: str, *, key: str | None = None) -> Component[Any]:
        return self.registry(kind).get(name, key=key)

    def recipe_search_paths(self) -> list[str]:
        paths: list[str] = []
        for result in self._pm.hook.rlzoo_recipe_search_paths():
            paths.extend(str(p) for p in result or [])
        return paths

    def plugins(self, *, include_all: bool = False) -> list[PluginInfo]:
        """Third-party plugins that loaded or failed to (a failure is news); with ``include_all`` also
        built-ins, blocked and disabled ones."""
        self.registries()
        shown = ("loaded", "failed")
        out = [i for i in self._info.values() if include_all or (not i.builtin and i.status in shown)]
        return sorted(out, key=lambda i: (not i.builtin, i.name))

    @property
    def pluggy(self) -> pluggy.PluginManager:
        return self._pm


def _unknown_hook(pm: pluggy.PluginManager, known: Iterable[str]) -> str | None:
    """The first implemented hook name that has no spec."""
    for name, caller in vars(pm.hook).items():
        if name.startswith("_") or name in known or getattr(caller, "spec", None) is not None:
            continue
        if any(not impl.optionalhook for impl in caller.get_hookimpls()):
            return str(name)
    return None


#: the plugin whose register-hook implementation is running (set around each implementation)
_CURRENT_PLUGIN: contextvars.ContextVar[str] = contextvars.ContextVar("rlzoo_current_plugin", default="?")
#: attribute an exception raised inside a plugin's register hook carries: that plugin's name
_FAILED_IN = "_rlzoo_failed_in_plugin"
_REGISTER_HOOKS = frozenset(kind.hook for kind in KINDS)


def _attributed(fn: Any, plugin: str) -> Any:
    """``fn`` (one plugin's register-hook implementation) run with that plugin as the current one."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        token = _CURRENT_PLUGIN.set(plugin)
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not hasattr(exc, _FAILED_IN):
                setattr(exc, _FAILED_IN, plugin)
            raise
        finally:
            _CURRENT_PLUGIN.reset(token)

    return call


def _attributed_plugin(plugin: object, name: str) -> object:
    """What rlzoo registers with pluggy for ``plugin``: the same hook implementations (markers,
    order, ``tryfirst``, hook wrappers unchanged), its register hooks run with ``name`` as the
    current plugin, so every part they register is stamped with it."""
    marker = f"{hookspecs.PROJECT}_impl"
    stand_in = types.SimpleNamespace()
    for attr in dir(plugin):
        fn = getattr(plugin, attr, None)
        opts = getattr(fn, marker, None) if inspect.isroutine(fn) else None
        if opts is None:
            continue
        hook = opts.get("specname") or attr
        if hook in _REGISTER_HOOKS and not (opts.get("hookwrapper") or opts.get("wrapper")):
            fn = _attributed(fn, name)
            setattr(fn, marker, opts)
        setattr(stand_in, attr, fn)
    stand_in.__name__ = getattr(plugin, "__name__", name)
    return stand_in


class HookRegistrar(Registrar[Any]):
    """The registry one hook call hands to every implementation (through pluggy's hook caller).

    Each part is stamped with the plugin whose implementation is running: rlzoo sets it around
    every register-hook implementation when the plugin is registered.
    """

    def __init__(self, registry: Registry[Any]) -> None:
        super().__init__(registry, plugin="?")

    @property  # type: ignore[override]
    def plugin(self) -> str:
        return _CURRENT_PLUGIN.get()

    @plugin.setter
    def plugin(self, value: str) -> None:
        pass


_default: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager (created on first use)."""
    global _default
    if _default is None:
        _default = PluginManager()
    return _default


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (tests; after changing RLZOO_PLUGINS)."""
    global _default
    _default = None
