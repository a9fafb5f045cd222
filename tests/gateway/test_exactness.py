"""Gateway episodes are exact: the multi-turn path's two checks, with the real ``openai`` SDK.

An agent written as a plain OpenAI chat loop (it keeps its history: each call sends the messages so
far, the assistant's reply as it got it, and a new user message) makes 3 calls per episode on a
tiny random Qwen2 over SmolLM2's BPE vocabulary (tests/agents/test_exactness_bpe.py). Then

(a) the trained ids at loss-mask-1 positions are the engine's samples, call by call, id for id;
(b) the trainer's recomputed log-probs equal the engine's (fp32, <= 1e-5);

and a deliberately re-tokenizing gateway (it records each reply as its decoded text encoded again,
the log-probs kept as the engine gave them) fails both.
"""

from __future__ import annotations

from typing import Any

import pytest
from agents.helpers import mask_runs

from rlzoo.gateway.rollout import call_number
from rlzoo.kernel.protocols import AgentResult, GenerationRequest, Sample, SamplingParams
from rlzoo.train.batching import samples_to_batch

openai = pytest.importorskip("openai")

CALLS = 3


def chat_agent(client: Any, row: Any) -> AgentResult:
    """A plain OpenAI chat loop: runs unchanged against any OpenAI-compatible server."""
    api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Count with me: {row['index']}"}]
    for turn in range(CALLS):
        out = api.chat.completions.create(model=client.model, messages=messages, max_tokens=40)  # type: ignore[arg-type]
        messages.append(out.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"and then {turn + 1}?"})
    return AgentResult(reward=1.0, final_answer=messages[-2]["content"])


def requests(n_prompts: int = 3, n: int = 2) -> list[GenerationRequest]:
    sp = SamplingParams(n=n, temperature=1.0, max_new_tokens=200, seed=5)
    return [GenerationRequest(f"p{i}", [0], sp, data={"index": i}) for i in range(n_prompts)]


def check_trained_ids_are_the_engines(samples: list[Sample], rec: Any, batch: Any) -> int:
    """(a); returns the most calls merged into one trajectory."""
    P = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    most = 0
    for row, s in enumerate(samples):
        calls = sorted(
            (k for k in rec.samples if k.startswith(f"{s.request_id}/{s.index}#g")),
            key=call_number,
        )
        engine = [t for k in calls for t in rec.samples[k].response_ids]
        mask = batch["response_mask"][row]  # [T]
        trained = batch["input_ids"][row, P:][mask.bool()].tolist()
        assert trained == engine, f"{s.request_id}/{s.index}: trained ids differ from the sampled ids"
        for (a, b), k in zip(mask_runs(s.loss_mask or []), calls):
            assert s.rollout_log_probs[a:b] == rec.samples[k].rollout_log_probs
            assert rec.samples[k].prompt_ids == [*s.prompt_ids, *s.response_ids[:a]]  # what the engine saw
        most = max(most, len(calls))
    return most


def _max_diff(bpe: dict[str, Any], samples: list[Sample]) -> float:
    batch = samples_to_batch(samples, None, bpe["pad"])
    lp, _ = bpe["trainer"].compute_log_probs(batch)  # [B, T]
    return float((lp - batch["rollout_log_probs"]).abs()[batch["response_mask"].bool()].max())


def test_an_sdk_chat_loop_is_one_exact_trajectory(make_gateway: Any, bpe_parts: dict[str, Any]) -> None:
    gw, rec = make_gateway(chat_agent)
    samples = gw.generate(requests())
    assert len(samples) == 6  # one trajectory per episode: no split
    assert all(s.agent["gateway"]["splits"] == {} for s in samples)  # type: ignore[index]
    assert all(s.agent["turns"] == CALLS and s.agent["error"] is None for s in samples)  # type: ignore[index]
    batch = samples_to_batch(samples, None, bpe_parts["pad"])
    assert check_trained_ids_are_the_engines(samples, rec, batch) >= 3  # (a)
    assert _max_diff(bpe_parts, samples) <= 1e-5  # (b)


def test_a_retokenizing_gateway_fails_both_checks(
    make_gateway: Any, bpe_parts: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a text-level gateway does: the reply is recorded as its text encoded again."""
    import rlzoo.gateway.rollout as mod

    tok, eos = bpe_parts["tok"], bpe_parts["eos"]
    original = mod.GatewayRollout._sample

    def retokenize(self: Any, *args: Any, **kw: Any) -> Any:
        out = original(self, *args, **kw)
        for _, call in out:
            stop = call.response_ids[-1:] if call.response_ids[-1:] == [eos] else []
            call.response_ids = [*tok(call.text, add_special_tokens=False)["input_ids"], *stop]
            call.log_probs = [*call.log_probs, *([0.0] * len(call.response_ids))][: len(call.response_ids)]
            call.versions = [0] * len(call.response_ids)
        return out

    monkeypatch.setattr(mod.GatewayRollout, "_sample", retokenize)
    gw, rec = make_gateway(chat_agent)
    samples = gw.generate(requests())
    batch = samples_to_batch(samples, None, bpe_parts["pad"])
    with pytest.raises(AssertionError, match=r"trained ids differ|assert"):
        check_trained_ids_are_the_engines(samples, rec, batch)  # (a) fails
    drift = _max_diff(bpe_parts, samples)
    print(f"re-tokenizing gateway: max |logp drift| {drift:.3g}")
    assert drift > 1e-3  # (b) fails


def test_an_agent_that_edits_its_history_is_split_and_counted(
    make_gateway: Any, bpe_parts: dict[str, Any]
) -> None:
    """The second call drops the first reply (a summary instead): two samples sharing the reward,
    counted as one split (history_edited); each sample is still exact."""

    def summariser(client: Any, row: Any) -> AgentResult:
        api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
        first = api.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "hi"}])
        summary = f"You said {len(first.choices[0].message.content or '')} characters. Go on."
        api.chat.completions.create(model=client.model, messages=[{"role": "user", "content": summary}])
        return AgentResult(reward=0.5)

    gw, _rec = make_gateway(summariser)
    samples = gw.generate(requests(1, 1))
    assert len(samples) == 2
    assert [s.agent["reward"] for s in samples] == [0.5, 0.5]  # type: ignore[index]
    assert samples[0].agent["gateway"]["splits"] == {"history_edited": 1}  # type: ignore[index]
    for s in samples:
        assert sum(s.loss_mask or []) == len(s.response_ids)  # one call each: every token sampled
    assert _max_diff(bpe_parts, samples) <= 1e-5


def test_refuse_fails_an_episode_that_would_split(make_gateway: Any) -> None:
    def summariser(client: Any, row: Any) -> AgentResult:
        api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
        for text in ("a", "b"):
            api.chat.completions.create(model=client.model, messages=[{"role": "user", "content": text}])
        return AgentResult(reward=1.0)

    gw, _ = make_gateway(summariser, split="refuse")
    samples = gw.generate(requests(1, 1))
    assert samples and all("rollout.gateway.split is 'refuse'" in s.agent["error"] for s in samples)  # type: ignore[index]
