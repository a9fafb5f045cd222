"""Built-in scorers: rule-based verifiers of one response against its ground truth.

Import-light: this module holds the params dataclasses and the registration only. The scoring
code lives in :mod:`rlzoo.algorithms.functional.scoring` and is imported on first use (it pulls in
``math-verify`` and sympy).

Every scorer is called as ``fn(response, ground_truth, data_source, extra_info, params)`` and
returns a float or a dict with at least ``score`` (other keys such as ``acc`` and ``pred`` become
metrics). No scorer ever ``eval``s model output in the trainer's process: ``code_tests`` runs it in
the sandbox (:mod:`rlzoo.sandbox`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param
from rlzoo.sandbox.params import SandboxParams

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import ScorerFn
    from rlzoo.kernel.registry import Registrar

_IMPL = "rlzoo.algorithms.functional.scoring"


@dataclass(frozen=True)
class MathParams:
    """Math answers checked with math-verify: last \\boxed{} answer vs the ground truth.

    The prediction is the content of the response's last ``\\boxed{...}`` (or ``\\fbox{...}``);
    without one, math-verify's own extraction runs on the response's tail ("final answer is ...",
    the last LaTeX or plain expression). The ground truth is parsed as if it were boxed. The two
    are compared with ``math_verify.verify``, which understands fractions, radicals, ``\\pi``,
    units, degrees, intervals, sets of answers and equations. Returns ``score`` (1.0 when correct,
    ``format_score`` when an answer was found but is wrong, 0.0 when none was found), ``acc`` and
    ``pred``. math-verify's signal-based timeout only works in a process's main thread: elsewhere
    it is off, and the ``process_pool`` reward manager bounds the time instead.
    """

    timeout: int = param(5, help="seconds math-verify may spend parsing or comparing (main thread only)")
    format_score: float = param(0.0, help="score of a response whose extracted answer is wrong")
    require_boxed: bool = param(False, help="score only \\boxed{} answers (no fallback extraction)")
    fallback_chars: int = param(300, help="without a \\boxed{}, how many trailing chars to search")
    float_rounding: int = param(6, help="decimal places floats are rounded to before comparing")
    strict: bool = param(True, help="math-verify strict mode: variables matter, sets != tuples")


@dataclass(frozen=True)
class GSM8KParams:
    """GSM8K (verl convention): the number after ``####`` (strict) or the last number (flexible).

    Only the response's last 300 characters are searched. Commas and ``$`` are stripped from the
    extracted number, which is compared as a string with the ground truth. Returns ``score`` when
    it matches, ``format_score`` when a number was found but differs, and 0.0 when none was found.
    """

    method: str = param("strict", help="'strict': answer after '#### '; 'flexible': the last number")
    format_score: float = param(0.0, help="score when a number was extracted but is wrong")
    score: float = param(1.0, help="score of a correct answer")


@dataclass(frozen=True)
class Geo3KParams:
    """Geometry3K (verl convention): math-verify accuracy of the boxed answer plus a format bonus.

    ``score = (1 - format_weight) * acc + format_weight * format`` where ``acc`` is 1.0 when the
    last ``\\boxed{}`` answer equals the ground truth (math-verify) and ``format`` is 1.0 when the
    whole response matches ``<think>...</think>...\\boxed{...}...``. verl grades ``acc`` with
    mathruler's ``grade_answer``; rlzoo uses math-verify (see docs/components/scorer.md).
    """

    format_weight: float = param(0.1, help="weight of the format term (verl's geo3k format_score)")
    use_boxed: bool = param(True, help="grade the last \\boxed{} content; False grades the whole response")
    timeout: int = param(5, help="seconds math-verify may spend (main thread only)")


@dataclass(frozen=True)
class DAPOMathParams:
    """DAPO-Math (verl math_dapo): the last ``Answer:`` line, normalised, equals the ground truth.

    Looks at the response's last ``clip_chars`` characters, takes the last match of
    ``(?i)Answer\\s*:\\s*([^\\n]+)``, applies the Minerva normalisation (units, ``\\text{}``,
    ``\\boxed{}``, shorthand ``\\frac``/``\\sqrt``, thousands separators) to both sides and compares
    strings. Returns ``score`` +1.0 / -1.0, ``acc`` and ``pred``. verl routes ``math_dapo`` and
    every ``aime*`` data source here; AIME-2024 in DAPO's release is scored this way.
    """

    strict_box_verify: bool = param(False, help="compare the last \\boxed{} of the last 100 chars instead")
    clip_chars: int = param(300, help="only the response's last N characters are searched")


@dataclass(frozen=True)
class AIMEParams:
    """AIME: an integer answer 0-999 from the last ``Answer:`` line or ``\\boxed{}``, +1 / -1.

    Stricter about form and looser about notation than ``dapo_math``: the prediction is read as
    an integer (``"018"``, ``"18"``, ``"\\boxed{18}"``, ``"18.0"`` are all 18) and must lie in
    0-999. Not what verl uses for ``aime*`` sources (that is ``dapo_math``); select it by name or
    through the ``auto`` scorer's ``routes``.
    """

    clip_chars: int = param(300, help="only the response's last N characters are searched")


@dataclass(frozen=True)
class AutoParams:
    """Choose the scorer from each sample's data source, like verl's default_compute_score.

    ``openai/gsm8k`` -> ``gsm8k``; ``hiyouga/geometry3k`` -> ``geo3k``; ``math_dapo``,
    ``BytedTsinghua-SIA/DAPO-Math-17k``, ``BytedTsinghua-SIA/AIME-2024`` and ``aime*`` ->
    ``dapo_math``; ``lighteval/MATH`` and friends -> ``math``; verl's code sources (``codecontests``,
    ``apps``, ``codeforces``, ``taco``) and ``rlzoo/python_functions`` -> ``code_tests``. ``routes`` adds or overrides
    entries; unknown sources go to ``fallback`` (an empty fallback makes them an error). Each
    routed scorer runs with its default params.
    """

    routes: dict[str, str] = param({}, help="extra data_source -> scorer-name entries (checked first)")
    fallback: str = param("math", help="scorer for unknown data sources; '' raises instead")


@dataclass(frozen=True)
class PythonFileParams:
    """Your own scoring function, in a Python file you name (verl's ``custom_reward_function``).

    The function is called as verl calls it, with keywords:
    ``function(data_source=..., solution_str=response, ground_truth=..., extra_info=..., **kwargs)``, and
    returns a number or a dict with at least ``score``. Checked when the recipe is validated, without
    running the file: it exists, it is a Python file that parses, it defines ``function`` at its top level
    and that function accepts those keywords (or ``**kwargs``). At scoring time the file is imported
    once per process, from that path only (never through ``sys.path``); what it raises or returns
    wrong is a scorer failure, counted like every scorer's.
    """

    path: str = param(help="the Python file that defines the function (required)")
    function: str = param("compute_score", help="the function's name in that file (verl's .name)")
    kwargs: dict[str, object] = param({}, help="extra keyword arguments of every call (verl's reward_kwargs)")

    def __post_init__(self) -> None:
        from rlzoo.algorithms.functional.scoring.file_check import check_function

        check_function(self.path, self.function, self.kwargs)


@dataclass(frozen=True)
class CodeTestsParams:
    """Run the response's code against the row's tests in the sandbox; score = fraction passed.

    The code is the response's last ```python block (bare code without fences). The row's
    ``ground_truth`` holds the tests: verl's ``prime_code`` layout (``fn_name`` with ``inputs`` /
    ``outputs``), stdin / stdout pairs, or assert statements (docs/code.md). Each test ends as one
    of ``passed``, ``wrong_answer``, ``runtime_error``, ``timeout``, ``compile_error``: the counts
    are returned (metrics) with ``score`` and ``acc`` (all passed). The code runs in the sandbox of
    ``sandbox`` (local, or a SandboxFusion server with ``sandbox.url``), never in the trainer.
    """

    sandbox: SandboxParams = param(SandboxParams(), help="where and how the code runs (docs/code.md)")
    test_timeout_s: float = param(
        2.0, gt=0, help="seconds one test may take (stdin/stdout tests: one execution each)"
    )
    max_tests: int = param(0, ge=0, help="run only a row's first N tests (0: all)")
    all_or_nothing: bool = param(False, help="score 1.0 only when every test passes (False: the fraction)")
    cache_size: int = param(
        4096, ge=0, help="(code, tests) results remembered: a repeated response is run once (0: off)"
    )

    def run_problems(self) -> list[str]:
        """What the machine lacks for ``sandbox.require`` (:class:`rlzoo.kernel.protocols.RunReadyParams`)."""
        return self.sandbox.run_problems()


#: the rule-based scorers, name -> (``"module:function"`` under :mod:`rlzoo.algorithms.functional.scoring`,
#: params class): registered below, and what the ``auto`` scorer routes to.
RULE_SCORERS: Mapping[str, tuple[str, type]] = {
    "math": ("math_answer:compute_score", MathParams),
    "gsm8k": ("gsm8k:compute_score", GSM8KParams),
    "geo3k": ("geo3k:compute_score", Geo3KParams),
    "dapo_math": ("dapo_math:compute_score", DAPOMathParams),
    "aime": ("dapo_math:compute_score_aime", AIMEParams),
    "code_tests": ("code_tests:compute_score", CodeTestsParams),
}


@hookimpl
def rlzoo_register_scorers(registry: Registrar[ScorerFn]) -> None:
    for name, (target, params) in RULE_SCORERS.items():
        registry.register(name, f"{_IMPL}.{target}", params=params)
    registry.register("auto", f"{_IMPL}.dispatch:compute_score", params=AutoParams)
    registry.register("python_file", f"{_IMPL}.user_file:compute_score", params=PythonFileParams)
