"""reasoning-gym's procedural tasks as rlzoo datasets, and their verifiers as a scorer.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates ~100 reasoning tasks
(arithmetic, logic, puzzles, games, ...) from a seed, with no download, and ships a verifier
(``score_answer``) per task. Install it with the extra: ``pip install rlzoo[reasoning-gym]``.

Dataset ``reasoning_gym``: any task by name (``task``, its config as ``config``), ``train_size`` /
``val_size`` rows from ``seed``, written as rlzoo's parquet schema (data source
``reasoning_gym/<task>``; ``extra_info`` keeps the entry and the task config the scorer needs).
Scorer ``reasoning_gym``: the task's own ``score_answer`` on the answer the response gives.

Import-light: the params and the registration only; the code is in
:mod:`rlzoo.tasks._reasoning_gym` (which imports reasoning_gym when a part runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlzoo import hookimpl, param
from rlzoo.kernel.params import MAX_SEED

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import ScorerFn
    from rlzoo.kernel.registry import PartFactory, Registrar

_IMPL = "rlzoo.tasks._reasoning_gym"
_NEEDS = {"requires": "reasoning-gym", "extra": "reasoning-gym"}


@dataclass(frozen=True)
class ReasoningGymDataParams:
    """A reasoning-gym task: ``train_size`` + ``val_size`` procedurally generated problems.

    ``reasoning_gym.create_dataset(task, size=..., seed=..., **config)`` makes the rows: training
    rows from ``seed``, validation rows from ``seed + 1``; a training row whose question is also a
    validation question is dropped (logged), so the held-out set is held out. ``extra_info`` keeps
    the task's entry (question, answer, metadata, encoded losslessly as JSON) and ``config``, so
    the ``reasoning_gym`` scorer verifies with the generating task's own verifier.
    """

    task: str = param(
        "basic_arithmetic", help="reasoning-gym task name (python -m rlzoo.tasks._reasoning_gym lists them)"
    )
    config: dict[str, Any] = param(
        {}, help="the task's config fields (reasoning-gym's <Task>Config), e.g. {min_terms: 2}"
    )
    train_size: int = param(1000, ge=1, help="training problems")
    val_size: int = param(100, ge=1, help="held-out validation problems")
    seed: int = param(0, ge=0, le=MAX_SEED, help="seed of the training problems (validation: seed + 1)")
    system_prompt: str = param(
        "default",
        help="one of reasoning-gym's SYSTEM_PROMPTS (default, DeepSeekZero, simple, direct, chain_of_draft) "
        "as a system message, or '' for none",
    )
    overwrite: bool = param(False, help="rebuild even when the files exist")


@dataclass(frozen=True)
class ReasoningGymScorerParams:
    """reasoning-gym's verifier: the task's ``score_answer(answer, entry)``, its score as the reward.

        The answer is the text of the response's last ``<answer>...</answer>`` (reasoning-gym's
        ``extract_answer``; none: ``None``, which the verifiers score 0), or with ``answer_tag: false``
        the whole response stripped. Reads the entry and task config the ``reasoning_gym`` dataset put
        in ``extra_info``. Some verifiers raise on an answer they cannot parse (e.g. prime_factorization on
    words): that answer scores 0 with ``unparsed`` 1.0. Info: ``acc`` (1.0 when the score is 1.0),
    ``pred`` (the answer read), ``unparsed``.
    """

    answer_tag: bool = param(
        True, help="read the answer from <answer>...</answer> (False: the whole response)"
    )


_TEXT = {"modalities": ("text",), **_NEEDS}


@hookimpl
def rlzoo_register_datasets(registry: Registrar[PartFactory]) -> None:
    registry.register("reasoning_gym", f"{_IMPL}:prepare", params=ReasoningGymDataParams, capabilities=_TEXT)


@hookimpl
def rlzoo_register_scorers(registry: Registrar[ScorerFn]) -> None:
    registry.register("reasoning_gym", f"{_IMPL}:score", params=ReasoningGymScorerParams, capabilities=_NEEDS)
