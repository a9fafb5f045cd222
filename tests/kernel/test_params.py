"""Every number setting has a range, declared or not: a float is finite, an integer fits 64 bits, a
seed fits the generators (rlzoo.kernel.params). Walked over every registered part's params class and
every recipe section, so a field added tomorrow is covered without a test of its own."""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any, Union, get_args, get_origin

import pytest

from rlzoo.kernel.binding import field_types
from rlzoo.kernel.kinds import KIND_NAMES
from rlzoo.kernel.params import INT_LIMIT, MAX_SEED, check_ranges, param, range_problems
from rlzoo.kernel.plugins import get_plugin_manager
from rlzoo.recipe.types import RecipeConfig

FLOAT_BAD = (math.nan, math.inf, -math.inf)
INT_BAD = (10**20, -(10**20), int(1e30), 2**63)  # a 20-digit seed; total_steps=1e30 bound as an int


def _number_type(tp: Any) -> type | None:
    """``int`` or ``float`` for a field typed so (or ``X | None``), else None."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else None
    return tp if tp in (int, float) else None


def _sections(cls: type) -> list[type]:
    out = [cls]
    for tp in field_types(cls).values():
        if get_origin(tp) in (Union, types.UnionType):  # LoraSettings | None
            tp = next((a for a in get_args(tp) if a is not type(None)), None)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += _sections(tp)
    return out


def _every_params_class() -> list[type]:
    pm = get_plugin_manager()
    classes = {c.params for k in KIND_NAMES for c in pm.registry(k) if c.params is not None}
    classes |= set(_sections(RecipeConfig))
    return sorted(classes, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _with(cls: type, name: str, value: Any) -> Any:
    """An instance of ``cls`` with its defaults (None where required) and ``name`` = ``value``,
    built without ``__init__``: what binding would hand to the range walk."""
    obj = object.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            v = f.default
        elif f.default_factory is not dataclasses.MISSING:
            v = f.default_factory()
        else:
            v = None
        object.__setattr__(obj, f.name, value if f.name == name else v)
    return obj


def _cases() -> list[Any]:
    out = []
    for cls in _every_params_class():
        hints = field_types(cls)
        for f in dataclasses.fields(cls):
            kind = _number_type(hints.get(f.name))
            if kind is not None:
                out.append(pytest.param(cls, f.name, kind, id=f"{cls.__qualname__}.{f.name}"))
    return out


CASES = _cases()


def test_the_walk_finds_the_settings_of_the_findings() -> None:
    names = {c.id for c in CASES}
    for needed in (
        "OptimSettings.lr",
        "OptimSettings.weight_decay",
        "OptimSettings.grad_clip",
        "RunSection.seed",
        "AlgorithmSection.entropy_coeff",
        "PPOClipParams.clip_ratio_low",
        "RolloutSection.temperature",
        "TrainerSection.total_steps",
        "LoraSettings.rank",
    ):
        assert needed in names
    assert len(CASES) > 200  # every part's params, not a sample


@pytest.mark.parametrize(("cls", "name", "kind"), CASES)
def test_every_number_setting_refuses_nonfinite_and_huge_values(cls: type, name: str, kind: type) -> None:
    for bad in FLOAT_BAD if kind is float else INT_BAD:
        problems = range_problems(_with(cls, name, bad), "sec")
        assert [p for p in problems if p.startswith(f"sec.{name}: must ")], (cls, name, bad, problems)
        assert [p for p in check_ranges(_with(cls, name, bad)) if p.startswith(f"{name} must ")]


@dataclasses.dataclass
class _Free:
    ratio: float = param(0.5, help="no range declared")
    count: int = param(3, help="no range declared")
    pair: tuple[float, float] = param((0.9, 0.99), help="numbers in a tuple")
    seed: int = param(0, ge=0, le=MAX_SEED, help="a seed")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ratio", math.nan, "ratio: must be a finite number, got nan"),
        ("ratio", -math.inf, "ratio: must be a finite number, got -inf"),
        ("count", INT_LIMIT + 1, "count: must fit a 64-bit integer"),
        ("pair", (0.9, math.inf), "pair: [1] must be a finite number, got inf"),
        ("seed", 2**32, f"seed: must be <= {2**32 - 1}, got {2**32}"),
    ],
)
def test_the_message_names_the_field_and_what_is_right(name: str, value: Any, message: str) -> None:
    (problem,) = range_problems(dataclasses.replace(_Free(), **{name: value}), "")
    assert problem.startswith(message)


def test_ordinary_values_pass() -> None:
    assert range_problems(_Free(ratio=1e30, count=-(2**63) + 1, seed=2**32 - 1), "x") == []
