"""The textarena environment (extra ``textarena``): TextArena's single-player games played turn by
turn, offline. Rewards worked out from the game's rules (TextArena's GuessTheNumber: 1 for the
number; an unfinished or invalid game ends with 1 - |last guess - target| / (20 - 1), 0 without a
guess; one invalid move is forgiven with a warning, the second ends the game)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("textarena", reason="the textarena extra: pip install rlzoo[textarena]")

from agents.helpers import ScriptedBackend, requests

from rlzoo.agents.rollout import MultiTurnRollout
from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.config import bind_part
from rlzoo.tasks._textarena import TextArenaError, start
from rlzoo.testing import EnvironmentConformance
from rlzoo.train.batching import samples_to_batch
from rlzoo.train.rewards import score_samples

#: GuessTheNumber-v0 (1..20, 20 guesses) at seed 3: the target is 8 (TextArena's game state)
ROW = {"extra_info": {"env_id": "GuessTheNumber-v0", "seed": 3}}
TARGET = 8


class TestTextArena(EnvironmentConformance):
    name = "textarena"
    row = ROW
    episodes = (
        (ROW, ["[8]"], 1.0),
        (ROW, ["I think [5]", "[8]"], 1.0),
        (ROW, ["[1]", "[1]", "[1]"], 1 - abs(1 - TARGET) / 19),  # a repeat is invalid; twice ends it
        (ROW, ["hello", "hello"], 0.0),  # no valid guess at all
    )


def test_the_target_at_seed_3() -> None:
    env, _, _ = start("GuessTheNumber-v0", 3)
    assert env.state.game_state["game_number"] == TARGET


def test_a_multi_turn_game_through_the_rollout(smollm2_tokenizer: Any) -> None:
    """A binary-search player (scripted: it reads the game's last hint in its prompt) through the
    multi-turn rollout with SmolLM2's tokenizer and chat template: each guess is a model turn
    (mask 1), each hint the template's delta (mask 0), and the game's win is the reward."""
    tok = smollm2_tokenizer
    eos = int(tok.convert_tokens_to_ids("<|im_end|>"))
    guesses: list[int] = []

    def player(turn: int, prompt: str) -> str:
        lo, hi = 1, 20
        for g, hint in zip(guesses, re.findall(r"The target number is (higher|lower)", prompt)):
            lo, hi = (g + 1, hi) if hint == "higher" else (lo, g - 1)
        guess = (lo + hi) // 2
        guesses.append(guess)
        return f"My guess: [{guess}]"

    pm = PluginManager(load_entrypoints=False)
    problems: list[str] = []
    env = bind_part("environment", {"name": "textarena"}, "rollout.environment", problems, pm)
    assert not problems and env is not None
    mt = MultiTurnRollout(
        ScriptedBackend(tok, player, eos),  # type: ignore[arg-type]
        lambda: env.fn(env.params),
        tok,
        MultiTurnSettings(max_turns=8, tool_call_format="plain"),
        max_response_length=800,
        stop_ids=(eos,),
    )
    req = requests(n_prompts=1, n=1)[0]
    req.data.update(ROW)
    try:
        (s,) = mt.generate([req])
    finally:
        mt.shutdown()
    assert guesses == [10, 5, 7, 8]  # 8 at seed 3: lower, higher, higher, found
    rec = s.agent
    assert rec is not None and (rec["turns"], rec["reward"], rec["error"]) == (4, 1.0, None)
    assert rec["env_info"] == {"invalid_move": 0.0, "won": 1.0}
    text = tok.decode(s.prompt_ids)
    assert "You are playing Guess The Number" in text
    observations = tok.decode([t for t, m in zip(s.response_ids, s.loss_mask or []) if not m])
    assert observations.count("The target number is") == 3 and "[10]" not in observations
    model = tok.decode([t for t, m in zip(s.response_ids, s.loss_mask or []) if m])
    assert model.count("My guess:") == 4
    (result,) = score_samples(None, tok, [s])
    batch = samples_to_batch([s], [result], pad_token_id=int(tok.pad_token_id or 0))
    assert float(batch["token_level_scores"].sum()) == 1.0
    assert int(batch["turn_ids"].max()) == 3


def test_prepare_writes_the_games_first_observations(tmp_path: Path) -> None:
    pm = PluginManager(load_entrypoints=False)
    problems: list[str] = []
    prep = bind_part(
        "dataset", {"name": "textarena", "train_size": 3, "val_size": 2, "seed": 2}, "prepare", problems, pm
    )
    assert not problems and prep is not None
    files = prep.fn(tmp_path, prep.params)
    import pyarrow.parquet as pq

    train = pq.read_table(files["train"]).to_pylist()
    val = pq.read_table(files["val"]).to_pylist()
    assert [r["extra_info"]["seed"] for r in train] == [2, 3, 4]
    assert [r["extra_info"]["seed"] for r in val] == [1_000_002, 1_000_003]
    _, _, obs = start("GuessTheNumber-v0", 3)
    assert train[1]["prompt"] == [{"role": "user", "content": obs[0][1]}]
    assert train[1]["data_source"] == "textarena/GuessTheNumber-v0"


def test_unknown_and_two_player_games_are_refused_clearly() -> None:
    with pytest.raises(TextArenaError, match=r"no env 'GuessTheNumbr-v0'.*similar: GuessTheNumber-v0"):
        start("GuessTheNumbr-v0", 0)
    with pytest.raises(TextArenaError, match="single-player"):
        start("TicTacToe-v0", 0)
    pm = PluginManager(load_entrypoints=False)
    problems: list[str] = []
    env = bind_part("environment", {"name": "textarena"}, "rollout.environment", problems, pm)
    assert env is not None
    with pytest.raises(TextArenaError, match="extra_info env_id at its seed"):
        env.fn(env.params).reset({"extra_info": {"index": 0}})
