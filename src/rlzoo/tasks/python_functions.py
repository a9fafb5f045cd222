"""Code tasks: write a small Python function that hidden tests check, run in the sandbox.

Parts (the code runs through :mod:`rlzoo.sandbox`, the same API for each):

- dataset ``python_functions``: procedurally generated functions ``f(x)`` whose body is an integer
  expression over ``x`` (``level`` 1: a digit; 2: ``x op d``; 3: ``x op d op d``, op in ``+ - *``).
  The prompt states the function (``f ( x ) = x * 3``) and the response is its body, completing
  ``def f(x): return``; the hidden tests call ``f`` on ``num_tests`` inputs (``code_tests`` scorer).
  Validation functions are held out from training (level 1 has only 10: there validation is those
  10). Also writes a tiny Llama with a word-level tokenizer of the prompts' words (``model/``).
- dataset ``verl_code``: a user's code dataset in verl's layout (parquet with ``prompt`` and
  ``reward_model.ground_truth`` as prime_code has: ``fn_name`` / ``inputs`` / ``outputs``, or
  stdin/stdout pairs, or asserts), checked row by row and written as train / val splits.
- environment ``python_functions``: the same tests as an episode; a failed attempt gets the test
  summary back and may try again (``max_attempts``).
- tool ``python``: runs the code a model passes and returns its output.

Import-light: params and registration only; the code is in :mod:`rlzoo.tasks._python_functions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param
from rlzoo.algorithms.scorers import CodeTestsParams
from rlzoo.sandbox.params import SandboxParams

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import EnvironmentFactory, ToolFactory
    from rlzoo.kernel.registry import PartFactory, Registrar

_IMPL = "rlzoo.tasks._python_functions"


@dataclass(frozen=True)
class PythonFunctionsDataParams:
    """Generated functions ``f(x)`` with hidden tests, train and held-out splits, and a tiny model.

    Difficulty knobs: ``level`` (the body's length: 1 a digit, 2 ``x op d``, 3 ``x op d op d``),
    ``ops`` (which operators appear) and ``num_tests``. ``ground_truth`` is verl's prime_code layout
    (``fn_name``, ``inputs``, ``outputs``) plus ``prefix`` (``def f(x):\\n    return ``, which the
    response completes); ``data_source`` is ``rlzoo/python_functions``.
    """

    level: int = param(2, ge=1, le=3, help="1: a digit; 2: 'x op d'; 3: 'x op d op d'")
    ops: str = param("+-*", help="operators the expressions use (a subset of '+-*')")
    num_tests: int = param(5, ge=1, help="hidden tests per function (inputs drawn from -9..9)")
    train_size: int = param(2048, ge=1, help="training prompts (drawn from the functions not held out)")
    val_size: int = param(32, ge=1, help="distinct functions held out for validation")
    hidden_size: int = param(64, ge=8, help="hidden size of the tiny model")
    num_layers: int = param(2, ge=1, help="transformer layers of the tiny model")
    seed: int = param(0, help="seed of the data and of the model's initialisation")
    overwrite: bool = param(False, help="rebuild even when the files exist")

    def __post_init__(self) -> None:
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"ops must be a non-empty subset of '+-*', got {self.ops!r}")


@dataclass(frozen=True)
class VerlCodeParams:
    """A code dataset in verl's layout (parquet, prompt + reward_model.ground_truth as prime_code has).

    Every row's tests are parsed the way ``code_tests`` reads them; rows whose tests cannot be read
    are dropped and counted in the log (all dropped is an error). ``data_source`` is kept when the row
    has one (``code`` otherwise); ``val_size`` rows are held out (the last ones after a seeded
    shuffle) unless ``val_files`` gives a validation set.
    """

    train_files: tuple[str, ...] = param((), help="parquet files of the training rows")
    val_files: tuple[str, ...] = param((), help="parquet files of the validation rows (none: held out)")
    val_size: int = param(64, ge=0, help="rows held out for validation when no val_files are given")
    limit: int | None = param(None, help="keep only the first N rows of each split (null: all)")
    seed: int = param(0, help="seed of the shuffle before the held-out rows are taken")


@dataclass(frozen=True)
class PythonFunctionsEnvParams:
    """One episode per row: the model writes code, the row's tests run in the sandbox.

    The reward of the episode is the fraction of tests its last attempt passes (``code_tests``
    params in ``tests``); while attempts remain, a failed attempt is answered with how many tests
    passed and the first failure's kind, and the model may answer again. ``info`` carries ``acc``
    and the outcome counts.
    """

    tests: CodeTestsParams = param(
        CodeTestsParams(), help="how the tests run (the code_tests scorer's params)"
    )
    max_attempts: int = param(1, ge=1, help="answers the model may give (a failed one gets feedback)")

    def run_problems(self) -> list[str]:
        """What the machine lacks for the sandbox's ``require`` (checked by ``rlzoo validate``)."""
        return self.tests.run_problems()


@dataclass(frozen=True)
class PythonToolParams:
    """The ``python`` tool: runs the ``code`` argument in the sandbox and returns what it printed.

    The reply is stdout, then stderr's tail when it failed, then ``[outcome]`` unless it ended ``ok``,
    cut to ``max_chars``.
    """

    sandbox: SandboxParams = param(SandboxParams(), help="where and how the code runs (docs/code.md)")
    max_chars: int = param(2000, ge=16, help="longest reply the model reads")

    def run_problems(self) -> list[str]:
        """What the machine lacks for the sandbox's ``require`` (checked by ``rlzoo validate``)."""
        return self.sandbox.run_problems()


@hookimpl
def rlzoo_register_datasets(registry: Registrar[PartFactory]) -> None:
    registry.register("python_functions", f"{_IMPL}:prepare", params=PythonFunctionsDataParams)
    registry.register("verl_code", f"{_IMPL}:prepare_verl_code", params=VerlCodeParams)


@hookimpl
def rlzoo_register_environments(registry: Registrar[EnvironmentFactory]) -> None:
    registry.register("python_functions", f"{_IMPL}:make_environment", params=PythonFunctionsEnvParams)


@hookimpl
def rlzoo_register_tools(registry: Registrar[ToolFactory]) -> None:
    registry.register("python", f"{_IMPL}:make_python_tool", params=PythonToolParams)
