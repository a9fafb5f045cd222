"""One registry class for every kind of part.

A plugin's ``rlzoo_register_<kind>s`` hook receives a :class:`Registrar` (a registry bound to the
plugin's name), typed with the kind's Protocol from :mod:`rlzoo.kernel.protocols`, and calls
:meth:`Registrar.register` once per part::

    @rlzoo.hookimpl
    def rlzoo_register_advantages(registry: rlzoo.Registrar[AdvantageFn]) -> None:
        registry.register(
            "rloo",
            "my_pkg.adv:compute_rloo",       # or the function object itself
            params=RLOOParams,               # frozen dataclass; fields documented with rlzoo.param()
            capabilities={"needs_group": True},
        )

The part may be given as an object or as a ``"module:attr"`` string that is imported on first use,
so listing parts never imports torch, ray, vllm or megatron.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from rlzoo.kernel.capabilities import capability_record
from rlzoo.kernel.errors import DuplicateComponentError, UnknownComponentError, closest
from rlzoo.kernel.kinds import KIND_BY_NAME

T = TypeVar("T")


def _resolve(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    if not attr:
        raise ValueError(f"lazy reference {ref!r} must look like 'package.module:attribute'")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _first_line(text: str | None) -> str:
    if not text:
        return ""
    for line in inspect.cleandoc(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def _own_doc(cls: type | None) -> str | None:
    """A dataclass's docstring, unless it is the signature dataclasses writes when there is none."""
    if cls is None:
        return None
    doc = cls.__doc__
    if doc and doc.startswith(cls.__name__ + "("):
        return None
    return doc


@dataclass(frozen=True)
class Component(Generic[T]):
    """One registered part."""

    kind: str
    name: str
    target: T | str
    params: type | None
    doc: str
    capabilities: Mapping[str, Any]
    plugin: str
    aliases: tuple[str, ...] = ()
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"{self.kind} {self.name!r} (plugin {self.plugin!r})"
        record = capability_record(self.kind, self.capabilities, where)  # ValueError: misspelt key
        declared = (
            {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
            if not isinstance(self.capabilities, Mapping)
            else {k: getattr(record, k) for k in self.capabilities}
        )
        object.__setattr__(self, "capabilities", MappingProxyType(declared))
        self._cache["caps"] = record

    @property
    def caps(self) -> Any:
        """The typed capability record of this part's kind (:mod:`rlzoo.kernel.capabilities`)."""
        return self._cache["caps"]

    @property
    def summary(self) -> str:
        """The doc's first line (what ``rlzoo components`` prints)."""
        return _first_line(self.doc)

    @property
    def is_loaded(self) -> bool:
        return not isinstance(self.target, str) or "obj" in self._cache

    def load(self) -> T:
        """The part itself, importing it on first use when registered as ``"module:attr"``."""
        if not isinstance(self.target, str):
            return self.target
        if "obj" not in self._cache:
            self._cache["obj"] = _resolve(self.target)
        return self._cache["obj"]  # type: ignore[no-any-return]

    def default_params(self) -> Any:
        """An instance of the params dataclass with every default (None if the part has none)."""
        return self.params() if self.params is not None else None

    def capability(self, key: str) -> Any:
        """One capability by name (its declared value, else the record's default). A key the kind's
        record does not declare is an error, not a silent False."""
        record = self.caps
        if key not in {f.name for f in dataclasses.fields(record)}:
            known = ", ".join(sorted(f.name for f in dataclasses.fields(record))) or "(none)"
            raise KeyError(f"{self.kind} has no capability {key!r}; its capabilities: {known}")
        return getattr(record, key)

    def param_fields(self) -> list[dict[str, Any]]:
        """Name, type, default and help of each param (for docs and ``components --json``)."""
        if self.params is None:
            return []
        out = []
        for f in dataclasses.fields(self.params):
            if f.default is not dataclasses.MISSING:
                default: Any = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = None
            out.append(
                {
                    "name": f.name,
                    "type": f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type)),
                    "default": default,
                    "required": f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                    "help": f.metadata.get("help", ""),
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "plugin": self.plugin,
            "summary": self.summary,
            "doc": inspect.cleandoc(self.doc) if self.doc else "",
            "aliases": list(self.aliases),
            "capabilities": {k: list(v) if isinstance(v, tuple) else v for k, v in self.capabilities.items()},
            "params": [
                {**p, "default": p["default"] if _jsonable(p["default"]) else repr(p["default"])}
                for p in self.param_fields()
            ],
        }


def _jsonable(x: Any) -> bool:
    return x is None or isinstance(x, (bool, int, float, str, list, dict))


class Registry(Generic[T]):
    """The registered parts of one kind, by name.

    ``get(name, key=...)`` raises :class:`UnknownComponentError` naming the kind, the config key
    that asked, every registered name (sorted) and the closest matches.
    """

    def __init__(self, kind: str) -> None:
        if kind not in KIND_BY_NAME:
            raise ValueError(f"unknown kind {kind!r}; kinds are {sorted(KIND_BY_NAME)}")
        self.kind = kind
        self._parts: dict[str, Component[T]] = {}
        self._aliases: dict[str, str] = {}

    # -- registration ---------------------------------------------------------------------------
    def register(
        self,
        name: str,
        target: T | str,
        *,
        plugin: str,
        params: type | None = None,
        doc: str | None = None,
        capabilities: Mapping[str, Any] | None = None,
        aliases: tuple[str, ...] | list[str] = (),
    ) -> Component[T]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: a part's name must be a non-empty string, got {name!r}")
        if params is not None and not (isinstance(params, type) and dataclasses.is_dataclass(params)):
            raise TypeError(
                f"{self.kind} {name!r} (plugin {plugin!r}): params must be a dataclass type, got {params!r}"
            )
        if doc is None:
            doc = _own_doc(params)
        if doc is None and not isinstance(target, str):
            doc = getattr(target, "__doc__", None)
        comp: Component[T] = Component(
            kind=self.kind,
            name=name,
            target=target,
            params=params,
            doc=inspect.cleandoc(doc) if doc else "",
            capabilities=capabilities if capabilities is not None else {},
            plugin=plugin,
            aliases=tuple(aliases),
        )
        for n in (name, *comp.aliases):
            owner = self._owner(n)
            if owner is not None:
                raise DuplicateComponentError(
                    f"{self.kind} {n!r} is registered twice: by plugin {owner.plugin!r} and by "
                    f"plugin {plugin!r}; rename one of them, or block one plugin with RLZOO_PLUGINS",
                    (owner.plugin, plugin),
                )
        self._parts[name] = comp
        for a in comp.aliases:
            self._aliases[a] = name
        return comp

    def _owner(self, name: str) -> Component[T] | None:
        if name in self._parts:
            return self._parts[name]
        if name in self._aliases:
            return self._parts[self._aliases[name]]
        return None

    # -- lookup ---------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self._parts)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._owner(name) is not None

    def __iter__(self) -> Iterator[Component[T]]:
        return iter(self._parts[n] for n in self.names())

    def __len__(self) -> int:
        return len(self._parts)

    def get(self, name: str, *, key: str | None = None) -> Component[T]:
        comp = self._owner(name) if isinstance(name, str) else None
        if comp is None:
            raise UnknownComponentError(self.unknown_message(name, key=key))
        return comp

    def unknown_message(self, name: object, *, key: str | None = None) -> str:
        names = self.names()
        where = f" (asked for by '{key}')" if key else ""
        msg = f"unknown {self.kind} {name!r}{where}. Registered {self.kind} names: "
        msg += ", ".join(names) if names else "(none: is the plugin that provides it installed?)"
        near = closest(str(name), [*names, *self._aliases])
        if near:
            msg += f". Did you mean: {', '.join(near)}?"
        return msg


class Registrar(Generic[T]):
    """What a hook receives: a registry that stamps every part with the calling plugin's name."""

    def __init__(self, registry: Registry[T], plugin: str) -> None:
        self._registry = registry
        self.plugin = plugin
        self.kind = registry.kind

    def register(
        self,
        name: str,
        target: T | str,
        *,
        params: type | None = None,
        doc: str | None = None,
        capabilities: Mapping[str, Any] | None = None,
        aliases: tuple[str, ...] | list[str] = (),
    ) -> Component[T]:
        """Register one part. See :class:`Registry` for the arguments."""
        return self._registry.register(
            name,
            target,
            plugin=self.plugin,
            params=params,
            doc=doc,
            capabilities=capabilities,
            aliases=aliases,
        )


PartFactory = Callable[..., Any]
