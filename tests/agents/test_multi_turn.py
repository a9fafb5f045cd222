"""Multi-turn rollouts on the native engine: token exactness as tested invariants.

(a) the ids trained at loss-mask-1 positions are exactly the ids the engine sampled, turn by turn;
(b) the train backend's recomputed log-probs there equal the engine's (fp32, <= 1e-5) over >= 3
turns. Here on the tool task's word-level tokenizer; ``test_exactness_bpe.py`` runs the same checks
with SmolLM2's BPE tokenizer and shows them failing on a build that re-tokenizes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

import rlzoo
from rlzoo.agents.rollout import MultiTurnRollout
from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.protocols import AgentTurn, EnvStep, GenerationRequest, Sample, SamplingParams, Tool
from rlzoo.runners.batching import samples_to_batch
from rlzoo.runners.inputs import load_tokenizer, rollout_spec, train_spec


class Recorder:
    """The inner backend, recording every turn it samples (what the engine produced)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.turns: dict[str, Sample] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        for s in self.inner.stream(timeout):
            self.turns[s.request_id] = s
            yield s


class Chatter:
    """A test environment: replies to each answer and ends after ``turns`` answers; reward per turn."""

    def __init__(self, turns: int = 3, tools: Sequence[Tool] = ()) -> None:
        self.left = turns
        self._tools = list(tools)

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def reset(self, row: Mapping[str, Any]) -> EnvStep:
        return EnvStep(messages=[{"role": "user", "content": "1 2 3 + 4 5 6"}])

    async def step(self, turn: AgentTurn) -> EnvStep:  # async on purpose: awaited off the engine
        self.left -= 1
        return EnvStep(messages=[{"role": "user", "content": "Answer: 7"}], reward=0.5, done=self.left <= 0)


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data_dir = tmp_path_factory.mktemp("tools")
    run = rlzoo.build_run("quickstart_tools", [f"data.dir={data_dir}", "data.max_response_length=160"])
    cfg = run.config
    from rlzoo.runners.inputs import ensure_data

    ensure_data(cfg)
    tok = load_tokenizer(cfg)
    spec = rollout_spec(cfg, tok)
    return {
        "cfg": cfg,
        "tok": tok,
        "spec": spec,
        "trainer": cfg.trainer.backend.fn(cfg.trainer.backend.params, train_spec(cfg, 1, tok)),
    }


def _rollout(parts: dict[str, Any], *, turns: int = 3) -> tuple[MultiTurnRollout, Recorder]:
    from rlzoo.algorithms.agents import CalcParams
    from rlzoo.algorithms.functional.agents import CalcTool

    cfg, tok, spec = parts["cfg"], parts["tok"], parts["spec"]
    inner = Recorder(cfg.rollout.backend.fn(cfg.rollout.backend.params, spec))
    calc = CalcTool(CalcParams(spaced_digits=True))
    settings = MultiTurnSettings(
        max_turns=6, max_tool_calls=3, per_turn_max_tokens=40, tool_call_format="plain"
    )
    mt = MultiTurnRollout(
        inner,  # type: ignore[arg-type]
        lambda: Chatter(turns, [calc]),
        tok,
        settings,
        max_response_length=spec.max_response_length,
        stop_ids=spec.eos_token_ids,
    )
    return mt, inner


def _requests(n_prompts: int = 6, n: int = 4) -> list[GenerationRequest]:
    sp = SamplingParams(n=n, temperature=1.0, max_new_tokens=160, seed=11)
    return [
        GenerationRequest(request_id=f"p{i}", prompt_ids=[0], sampling=sp, data={"index": i})
        for i in range(n_prompts)
    ]


def _segments(s: Sample) -> list[tuple[int, int]]:
    """(start, end) of each run of loss-mask-1 positions: the model's turns."""
    out, start = [], None
    mask = [*(s.loss_mask or []), 0]
    for j, m in enumerate(mask):
        if m and start is None:
            start = j
        elif not m and start is not None:
            out.append((start, j))
            start = None
    return out


def check_sampled_ids_are_trained(samples: Sequence[Sample], rec: Recorder, batch: Any) -> int:
    """(a): every model turn of every trajectory, at mask-1 positions of the training batch, is the
    engine's sample for that turn, id for id. Returns the most turns seen."""
    P = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    most = 0
    for row, s in enumerate(samples):
        turns = sorted(
            (k for k in rec.turns if k.startswith(f"{s.request_id}/{s.index}#t")),
            key=lambda k: int(k.rsplit("#t", 1)[1]),
        )
        segs = _segments(s)
        assert len(segs) == len(turns) == s.agent["turns"], (s.uid, segs, turns)  # type: ignore[index]
        mask = batch["response_mask"][row]  # [T]
        trained = batch["input_ids"][row, P:][mask.bool()].tolist()
        engine = [t for k in turns for t in rec.turns[k].response_ids]
        assert trained == engine, f"{s.uid}: trained ids differ from the sampled ids"
        for (a, b), k in zip(segs, turns):
            assert s.response_ids[a:b] == rec.turns[k].response_ids
            assert s.rollout_log_probs[a:b] == rec.turns[k].rollout_log_probs
            assert s.versions[a:b] == rec.turns[k].versions
            # the engine saw exactly the trajectory so far as this turn's prompt
            assert rec.turns[k].prompt_ids == [*s.prompt_ids, *s.response_ids[:a]]
        most = max(most, len(turns))
    return most


def test_trained_ids_are_the_sampled_ids(parts: dict[str, Any]) -> None:
    mt, rec = _rollout(parts)
    samples = mt.generate(_requests())
    batch = samples_to_batch(samples, None, int(parts["tok"].pad_token_id))
    assert check_sampled_ids_are_trained(samples, rec, batch) >= 3
    # observations are in the context (attention 1) but never trained (mask 0)
    env_tokens = sum(s.agent["env_tokens"] for s in samples)  # type: ignore[index]
    assert env_tokens > 0
    assert int(batch["response_mask"].sum()) == sum(s.agent["model_tokens"] for s in samples)  # type: ignore[index]


def test_trainer_log_probs_equal_the_engine_s_over_three_turns(parts: dict[str, Any]) -> None:
    mt, _ = _rollout(parts)
    samples = mt.generate(_requests())
    assert max(s.agent["turns"] for s in samples) >= 3  # type: ignore[index]
    batch = samples_to_batch(samples, None, int(parts["tok"].pad_token_id))
    lp, _ = parts["trainer"].compute_log_probs(batch)  # [B, T] fp32
    mask = batch["response_mask"].bool()  # [B, T]
    diff = (lp - batch["rollout_log_probs"]).abs()[mask]
    assert diff.numel() > 50 and float(diff.max()) <= 1e-5, float(diff.max())
