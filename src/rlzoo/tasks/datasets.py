"""Built-in dataset preparers (kind ``dataset``): params and registration only.

Import-light: the preparers (which import ``datasets``) live in :mod:`rlzoo.tasks.prepare` and are
registered as ``"module:attr"`` strings, so ``rlzoo components`` never imports them. Each is
called as ``fn(out_dir: Path, params) -> dict[str, Path]`` (split -> parquet file written in the
schema of :mod:`rlzoo.data.schema`); ``rlzoo prepare NAME [key=value ...]`` runs one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlzoo import hookimpl, param

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar

_SOURCE_HELP = (
    "hub dataset name, or a local path: a folder of parquet/json/arrow files (a downloaded hub "
    "repo), a single file, or a glob; loaded with datasets.load_dataset"
)
_SPLITS_HELP = (
    "splits to write, each 'name' or 'upstream:written' (e.g. 'train:test' writes the upstream "
    "train split as test.parquet); a comma-separated string is accepted"
)
_LIMIT_HELP = "keep only the first N rows of each split (null: all); for quick experiments"


@dataclass(frozen=True)
class Geometry3kParams:
    """Geometry3K: 3,002 geometry problems with a diagram each (hiyouga/geometry3k), verl's geo3k prompt.

    Upstream columns ``images`` (one diagram), ``problem`` (text with an ``<image>`` placeholder)
    and ``answer``; splits train 2,101 / validation 300 / test 601. The prompt is the problem plus
    verl's instruction to reason inside ``<think> </think>`` and put the final answer in
    ``\\boxed{}``; one ``<image>`` placeholder per image is guaranteed. ``data_source`` is
    ``hiyouga/geometry3k``, ``ground_truth`` the answer.
    """

    source: str = param("hiyouga/geometry3k", help=_SOURCE_HELP)
    splits: tuple[str, ...] | str = param(("train", "validation", "test"), help=_SPLITS_HELP)
    limit: int | None = param(None, help=_LIMIT_HELP)
    instruction: str | None = param(
        None, help="text appended to each problem (null: verl's geo3k <think>/\\boxed{} instruction)"
    )


@dataclass(frozen=True)
class GSM8KParams:
    """GSM8K grade-school math (openai/gsm8k, config main) with verl's "####" prompt.

    Upstream columns ``question`` and ``answer`` (a worked solution ending in ``#### <number>``).
    The prompt is the question plus ``Let's think step by step and output the final answer after
    "####".``; ``ground_truth`` is the text after ``####`` with thousands separators removed.
    Rows without ``####`` are dropped (and counted in the log). ``data_source`` is ``openai/gsm8k``.
    """

    source: str = param("openai/gsm8k", help=_SOURCE_HELP)
    config: str | None = param("main", help="dataset config ('main' or 'socratic')")
    splits: tuple[str, ...] | str = param(("train", "test"), help=_SPLITS_HELP)
    limit: int | None = param(None, help=_LIMIT_HELP)
    instruction: str | None = param(
        None, help="text appended to each question (null: verl's 'Let's think step by step ...')"
    )


@dataclass(frozen=True)
class DapoMathParams:
    """DAPO-Math-17k (BytedTsinghua-SIA/DAPO-Math-17k): already in verl's layout; kept as is.

    ``prompt`` (the DAPO "Answer: $Answer" instruction around each problem), ``reward_model``,
    ``data_source`` (``math_dapo``) and ``ability`` are preserved; ``extra_info.split`` is added.
    The hub copy repeats each of its ~17.9k prompts ~100 times (1.79M rows); ``dedup`` keeps the
    first row of each distinct prompt.
    """

    source: str = param("BytedTsinghua-SIA/DAPO-Math-17k", help=_SOURCE_HELP)
    splits: tuple[str, ...] | str = param(("train",), help=_SPLITS_HELP)
    limit: int | None = param(None, help=_LIMIT_HELP + " (applied after dedup)")
    dedup: bool = param(True, help="drop rows whose prompt repeats an earlier row's prompt")


@dataclass(frozen=True)
class Aime2024Params:
    """AIME 2024 (BytedTsinghua-SIA/AIME-2024) in verl's layout, the DAPO validation set.

    Same layout as DAPO-Math-17k, kept as is. Its only upstream split is ``train``; it is an
    evaluation set, so it is written as ``test.parquet`` (``splits: ['train:test']``). The hub
    copy repeats each of the 30 problems so that accuracy averages over several samples; set
    ``dedup=true`` to keep one row per problem.
    """

    source: str = param("BytedTsinghua-SIA/AIME-2024", help=_SOURCE_HELP)
    splits: tuple[str, ...] | str = param(("train:test",), help=_SPLITS_HELP)
    limit: int | None = param(None, help=_LIMIT_HELP + " (applied after dedup)")
    dedup: bool = param(False, help="drop rows whose prompt repeats an earlier row's prompt")


@hookimpl
def rlzoo_register_datasets(registry: Registrar[PartFactory]) -> None:
    text: dict[str, Any] = {"modalities": ("text",)}
    table: list[tuple[str, type, dict[str, Any], tuple[str, ...]]] = [
        ("geometry3k", Geometry3kParams, {"modalities": ("text", "image")}, ("geo3k",)),
        ("gsm8k", GSM8KParams, text, ()),
        ("dapo_math", DapoMathParams, text, ("dapo-math-17k",)),
        ("aime2024", Aime2024Params, text, ("aime-2024",)),
    ]
    for name, params, capabilities, aliases in table:
        # each preparer is ``prepare`` in rlzoo.tasks.prepare.<name>
        prepare = f"rlzoo.tasks.prepare.{name}:prepare"
        registry.register(name, prepare, params=params, capabilities=capabilities, aliases=aliases)
