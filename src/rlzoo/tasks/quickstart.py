"""The quickstart task: a synthetic digit task, a word-level tokenizer and a tiny model, all built offline.

Task ``find`` (the default): each prompt is four words, three letters (``a`` .. ``f``) and one
digit anywhere, e.g. ``c 7 a a``; the answer is the digit. The answer is a function of the prompt
(no constant answer scores above 1 in 10), and the model has to learn *where* to look: attend to
the one digit among the letters and copy it. Validation prompts (40 of the 8,640 distinct ones)
are held out from training, so validation measures the rule, not a table. A ~100k-parameter
Llama built from a config starts near chance and reaches 1.0 validation accuracy within ~50
GRPO steps (well under a minute on 2 laptop cores).

Task ``first_last`` (harder, ``data.prepare.task=first_last``): ``<op> d1 .. dk`` with ``op``
``first`` or ``last`` and ``num_digits`` different digits; the answer is ``d1`` or ``dk``. A
policy that copies any digit of the prompt scores 1/k without reading ``op``, and GRPO often
stalls there for hundreds of steps (seed-dependent), which is why it is not the default.

The scorer gives 1.0 when the response's first word is the answer.

Registered parts: dataset ``quickstart`` (writes train/val parquet, tokenizer and model into the
``data.dir`` folder), scorer ``quickstart``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param
from rlzoo.kernel.params import MAX_SEED

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import ScorerFn
    from rlzoo.kernel.registry import PartFactory, Registrar

_IMPL = "rlzoo.tasks._quickstart"


@dataclass(frozen=True)
class QuickstartDataParams:
    """Synthetic digit task (find the digit; or first / last digit) with a tokenizer and a tiny model.

    Writes ``train.parquet``, ``val.parquet`` (rlzoo's schema, data_source ``rlzoo/quickstart``)
    and ``model/`` (a Llama config with random weights and a word-level tokenizer with a chat
    template; Llama, not Qwen2, so that plain ``AutoTokenizer`` keeps the word-level tokenizer:
    :func:`rlzoo.models.tiny.build_tiny_llama`) into the output folder.
    """

    train_size: int = param(2048, help="training prompts (drawn from the distinct prompts not held out)")
    val_size: int = param(40, help="distinct prompts held out for validation")
    task: str = param("find", help="'find' (the one digit among letters) or 'first_last' (module doc)")
    num_digits: int = param(4, help="words per prompt ('find') / different digits per prompt ('first_last')")
    hidden_size: int = param(64, help="hidden size of the tiny model")
    num_layers: int = param(2, help="transformer layers of the tiny model")
    seed: int = param(
        0, ge=0, le=MAX_SEED, help="seed of the model's random initialisation and the data order"
    )
    overwrite: bool = param(False, help="rebuild even when the files exist")

    def __post_init__(self) -> None:
        if self.task not in ("find", "first_last"):
            raise ValueError(f"task must be 'find' or 'first_last', got {self.task!r}")
        if not 2 <= self.num_digits <= 6:
            raise ValueError(f"num_digits must be in 2..6, got {self.num_digits}")


@dataclass(frozen=True)
class QuickstartScorerParams:
    """Quickstart scorer: 1.0 when the response's first word equals the answer, else 0.0."""


@hookimpl
def rlzoo_register_datasets(registry: Registrar[PartFactory]) -> None:
    registry.register("quickstart", f"{_IMPL}:prepare", params=QuickstartDataParams)


@hookimpl
def rlzoo_register_scorers(registry: Registrar[ScorerFn]) -> None:
    registry.register("quickstart", f"{_IMPL}:score", params=QuickstartScorerParams)
