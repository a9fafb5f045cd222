"""The reasoning-gym adapter (extra ``reasoning-gym``): its tasks as rlzoo datasets and its
verifiers as the ``reasoning_gym`` scorer, checked against reasoning-gym's own ``score_answer``.
Offline: reasoning-gym generates every problem from a seed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from data.conftest import make_tokenizer

from rlzoo.data.dataset import PromptDataset
from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.config import bind_part

rg = pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra: pip install rlzoo[reasoning-gym]")

from rlzoo.tasks._reasoning_gym import ReasoningGymError, decode, encode, make_task, task_names  # noqa: E402

#: tasks whose config must name something (composite: the datasets it mixes)
NEEDS_CONFIG = {"composite"}


def _same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (a tuple is not a list; a numpy scalar is its
    Python scalar)."""
    a, b = (
        x.item() if type(x).__module__ == "numpy" and getattr(x, "shape", None) == () else x for x in (a, b)
    )
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


@pytest.fixture(scope="module")
def pm() -> PluginManager:
    return PluginManager(load_entrypoints=False)


def _part(pm: PluginManager, kind: str, spec: dict[str, Any]) -> Any:
    problems: list[str] = []
    sel = bind_part(kind, spec, kind, problems, pm)
    assert not problems and sel is not None, problems
    return sel


def test_every_task_travels_losslessly_and_its_verifier_agrees() -> None:
    """Every task reasoning-gym registers: two entries survive the JSON of extra_info with their
    types, and the scorer (a verifier built apart from the generator) scores the reference answer
    and a wrong one exactly as the generating dataset's own score_answer does."""
    from rlzoo.tasks._reasoning_gym import score
    from rlzoo.tasks.reasoning_gym import ReasoningGymScorerParams

    names = task_names()
    assert len(names) >= 100
    checked, unparsed = 0, 0.0
    for name in names:
        if name in NEEDS_CONFIG:
            continue
        ds = make_task(name, {}, 2, 3)
        for i, x in enumerate(ds):
            entry = {"question": x["question"], "answer": x["answer"], "metadata": x["metadata"]}
            back = decode(json.loads(json.dumps(encode(entry))))
            assert _same(back, entry), name
            extra = {"task": name, "config": json.dumps(encode({})), "entry": json.dumps(encode(entry))}
            for answer in ([x["answer"]] if x["answer"] is not None else []) + ["definitely not it"]:
                got = score(f"think <answer>{answer}</answer>", "", "", extra, ReasoningGymScorerParams())
                try:
                    expected, raised = ds.score_answer(answer, x), 0.0
                except Exception:  # reasoning-gym's verifier cannot read this answer: wrong
                    expected, raised = 0.0, 1.0
                assert (got["score"], got["unparsed"]) == (expected, raised), (name, i, answer)
                checked += 1
                unparsed += raised
    assert checked > 150 and 0 < unparsed < 20


def test_prepare_writes_rlzoos_schema_and_the_scorer_verifies(tmp_path: Path, pm: PluginManager) -> None:
    config = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}
    spec = {"name": "reasoning_gym", "task": "basic_arithmetic", "config": config, "train_size": 40}
    prep = _part(pm, "dataset", {**spec, "val_size": 8, "seed": 5})
    files = prep.fn(tmp_path, prep.params)
    assert set(files) == {"train", "val"}
    train = PromptDataset(files["train"], make_tokenizer(), strict=True)
    val = PromptDataset(files["val"], make_tokenizer(), strict=True)
    ref_train = rg.create_dataset("basic_arithmetic", size=40, seed=5, **config)
    ref_val = rg.create_dataset("basic_arithmetic", size=8, seed=6, **config)
    assert [val[i]["messages"][-1]["content"] for i in range(len(val))] == [x["question"] for x in ref_val]
    held = {x["question"] for x in ref_val}
    assert [train[i]["messages"][-1]["content"] for i in range(len(train))] == [
        x["question"] for x in ref_train if x["question"] not in held
    ]
    row = train[0]
    assert row["data_source"] == "reasoning_gym/basic_arithmetic"
    assert row["messages"][0] == {"role": "system", "content": rg.utils.SYSTEM_PROMPTS["default"]}
    ref = next(x for x in ref_train if x["question"] == row["messages"][-1]["content"])
    assert row["ground_truth"] == ref["answer"]
    # the scorer selected by name, as a recipe does (reward.scorer.name=reasoning_gym)
    scorer = _part(pm, "scorer", {"name": "reasoning_gym"})
    for response, answer in [
        (f"so <answer>{ref['answer']}</answer>", ref["answer"]),
        ("<answer>12345</answer>", "12345"),
        (f"{ref['answer']} (no tags)", None),
    ]:
        got = scorer.fn(response, row["ground_truth"], row["data_source"], row["extra_info"], scorer.params)
        assert got["score"] == ref_train.score_answer(answer, ref), response
    assert (
        scorer.fn(f"<answer>{ref['answer']}</answer>", "", "", row["extra_info"], scorer.params)["acc"] == 1.0
    )
    raw = _part(pm, "scorer", {"name": "reasoning_gym", "answer_tag": False})
    assert raw.fn(f" {ref['answer']}\n", "", "", row["extra_info"], raw.params)["score"] == 1.0
    # the same params again: the files are reused, not rewritten
    mtime = files["train"].stat().st_mtime_ns
    prep.fn(tmp_path, prep.params)
    assert files["train"].stat().st_mtime_ns == mtime


def test_a_game_task_with_metadata_the_verifier_needs(tmp_path: Path, pm: PluginManager) -> None:
    """A puzzle (answer None: many solutions) whose verifier checks a solution against the puzzle in
    the metadata: scored through the parquet file exactly as by reasoning-gym."""
    prep = _part(
        pm, "dataset", {"name": "reasoning_gym", "task": "mini_sudoku", "train_size": 3, "val_size": 2}
    )
    files = prep.fn(tmp_path, prep.params)
    ds = PromptDataset(files["val"], make_tokenizer(), strict=True)
    ref = rg.create_dataset("mini_sudoku", size=2, seed=1)
    scorer = _part(pm, "scorer", {"name": "reasoning_gym"})
    for i in range(2):
        row, x = ds[i], ref[i]
        for answer in (x["answer"], x["answer"].replace("1", "2", 1), "no"):
            got = scorer.fn(f"<answer>{answer}</answer>", "", "", row["extra_info"], scorer.params)
            assert got["score"] == ref.score_answer(answer, x)
    assert {
        scorer.fn(f"<answer>{ref[0]['answer']}</answer>", "", "", ds[0]["extra_info"], scorer.params)["score"]
    } == {1.0}


def test_bad_names_and_configs_say_what_would_be_right(tmp_path: Path, pm: PluginManager) -> None:
    with pytest.raises(ReasoningGymError, match=r"no task 'basic_arithmetc'.*similar: .*basic_arithmetic"):
        make_task("basic_arithmetc", {}, 1, 0)
    with pytest.raises(ReasoningGymError, match=r"refused config .*min_terms"):
        make_task("basic_arithmetic", {"no_such_field": 1}, 1, 0)
    prep = _part(pm, "dataset", {"name": "reasoning_gym", "system_prompt": "nope"})
    with pytest.raises(ReasoningGymError, match="SYSTEM_PROMPTS"):
        prep.fn(tmp_path, prep.params)
    scorer = _part(pm, "scorer", {"name": "reasoning_gym"})
    with pytest.raises(ReasoningGymError, match="extra_info"):
        scorer.fn("<answer>1</answer>", "1", "openai/gsm8k", {"index": 0}, scorer.params)
    assert not list(tmp_path.iterdir())  # nothing written before the error


def test_validate_names_the_extra_when_reasoning_gym_is_missing(
    pm: PluginManager, hide_distribution: Callable[[str], None]
) -> None:
    import dataclasses

    from rlzoo.recipe.checks import _optional_package_rule

    @dataclasses.dataclass
    class Cfg:  # the rule walks every selected part of a recipe (RecipeConfig.selections)
        scorer: Any
        prepare: Any

        def selections(self) -> list[Any]:
            return [self.scorer, self.prepare]

    cfg = Cfg(_part(pm, "scorer", {"name": "reasoning_gym"}), _part(pm, "dataset", {"name": "reasoning_gym"}))
    assert _optional_package_rule(cfg) == []  # type: ignore[arg-type]
    hide_distribution("reasoning-gym")
    problems = _optional_package_rule(cfg)  # type: ignore[arg-type]
    assert len(problems) == 2 and all("pip install rlzoo[reasoning-gym]" in p for p in problems), problems


def test_a_missing_package_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlzoo.tasks import _reasoning_gym

    monkeypatch.setitem(__import__("sys").modules, "reasoning_gym", None)  # import raises ImportError
    with pytest.raises(
        ReasoningGymError,
        match=r"reasoning_gym dataset and scorer need the reasoning-gym package: "
        r"pip install rlzoo\[reasoning-gym\]",
    ):
        _reasoning_gym._rg()
