"""ConfigError's message: each problem on its own line, one problem given as a string kept whole."""

from __future__ import annotations

from rlzoo.kernel.errors import ConfigError


def test_problems_are_listed_one_per_line() -> None:
    err = ConfigError(["a.b: bad", "c: worse"])
    assert err.problems == ["a.b: bad", "c: worse"]
    assert str(err) == "invalid recipe: 2 problem(s)\n  - a.b: bad\n  - c: worse"


def test_a_single_string_is_one_problem_not_one_per_character() -> None:
    err = ConfigError("trainer.x: needs y")  # failed before: 18 problems, one per character
    assert err.problems == ["trainer.x: needs y"]
    assert str(err) == "invalid recipe: 1 problem(s)\n  - trainer.x: needs y"
