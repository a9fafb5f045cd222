"""Many concurrent episodes over many rounds, the way a long ``quickstart_gateway`` run drives the gateway.

The suspects of the step-144 timeouts (docs/agents.md, "bring your own agent"): one ``openai``
client shared by 64 agent threads (httpx's pool, keep-alive connections reused across steps and
closed by the client once idle past its 5 s expiry), the server's request handling, the per-call
wait on the engine and the engine's queue. Each round here is a sync step: 64 episodes at once of the
shipped ``calc_agent`` (the SDK loop in process, one client per process) on a real native engine,
then a weight push (pause, update, resume). Every episode must finish well within a short
``agent_timeout_s``, every call must be sampled and consumed, and the server must not keep a thread
per round. A stall of the engine longer than ``agent_timeout_s`` fails the episodes it holds
(counted, as at step 144) and the next round is clean.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rlzoo.kernel.protocols import GenerationRequest, Sample, SamplingParams

pytest.importorskip("openai")

ROWS, N = 8, 8  # 64 episodes a round, all at once (rollout.gateway.concurrency 64)


def _gateway(timeout: float) -> tuple[Any, Any]:
    from functools import partial

    from rlzoo.agents.settings import MultiTurnSettings
    from rlzoo.backends.native.rollout import NativeRolloutBackend
    from rlzoo.backends.native.rollout_params import NativeRolloutParams
    from rlzoo.gateway.rollout import GatewayRollout
    from rlzoo.gateway.settings import GatewaySettings
    from rlzoo.kernel.settings import RolloutSpec
    from rlzoo.models.tiny import build_tiny_qwen2
    from rlzoo.tasks._agents import make_calc_agent
    from rlzoo.tasks._tools import build_tokenizer
    from rlzoo.tasks.agents import CalcAgentParams

    tok = build_tokenizer()
    model, _ = build_tiny_qwen2(tokenizer=tok, hidden_size=32, num_layers=2, max_position_embeddings=128)
    eos = int(tok.eos_token_id)
    spec = RolloutSpec(
        model_path="<in memory>",
        tokenizer_path="<in memory>",
        max_prompt_length=16 + 48,
        max_response_length=48,
        eos_token_ids=(eos,),
        pad_token_id=int(tok.pad_token_id),
    )
    inner = NativeRolloutBackend(NativeRolloutParams(max_num_seqs=256), spec, model=model.eval())
    gw = GatewayRollout(
        inner,
        partial(make_calc_agent, CalcAgentParams()),
        tok,
        GatewaySettings(agent_timeout_s=timeout, concurrency=64),
        MultiTurnSettings(max_turns=2, max_tool_calls=1, per_turn_max_tokens=16, tool_call_format="plain"),
        max_response_length=48,
        max_prompt_length=16,
        stop_ids=(eos,),
        agent_name="calc_agent",
    )
    return gw, inner


def _round(gw: Any, k: int) -> list[Sample]:
    sp = SamplingParams(n=N, temperature=1.0, max_new_tokens=48, seed=k)
    rows = [{"extra_info": {"a": 500 + 7 * i + k, "b": 600 + 3 * i}} for i in range(ROWS)]
    return gw.generate([GenerationRequest(f"s{k}r0-{i}", [0], sp, data=row) for i, row in enumerate(rows)])


def _push(inner: Any, version: int) -> None:
    import torch

    inner.pause()
    with torch.no_grad():
        named = [(k, v + 0.01 * torch.randn_like(v)) for k, v in inner.model.state_dict().items()]
    inner.update_weights(named, version)
    inner.resume()


def _server_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("Thread-"))  # the handlers' names


@pytest.mark.slow  # ~25 s on 2 loaded cores (5.5 s of it idle, past the keep-alive expiry)
def test_many_rounds_of_concurrent_sdk_episodes_all_finish() -> None:
    base = _server_threads()  # earlier tests' servers may have left handlers of connections still open
    gw, inner = _gateway(timeout=20.0)
    threads = []
    try:
        for k in range(3):
            t0 = time.monotonic()
            out = _round(gw, k)
            took = time.monotonic() - t0
            assert len(out) == ROWS * N
            errors = [s.agent["error"] for s in out if s.agent["error"]]  # type: ignore[index]
            assert errors == [], errors[:3]
            for s in out:
                g = s.agent["gateway"]  # type: ignore[index]
                assert g["calls"] == s.agent["turns"] >= 1 and g["late_calls"] == g["refused_calls"] == 0  # type: ignore[index]
            assert took < 20.0
            assert gw._by_call == {} and inner.num_pending() == 0  # every call sampled and consumed
            threads.append(_server_threads() - base)
            _push(inner, k + 1)
            if k == 0:  # idle past httpx's keep-alive expiry (5 s): the client closes its connections
                time.sleep(5.5)
    finally:
        gw.shutdown()
    # one handler thread per open connection: bounded by the pool, not growing round by round
    assert max(threads) <= 64 + 8, threads


def test_an_engine_stall_past_the_timeout_fails_what_it_holds_and_the_next_round_is_clean() -> None:
    gw, inner = _gateway(timeout=1.5)
    try:
        _round(gw, 0)  # warm: the shared client and its connections exist
        stall = threading.Timer(0.2, inner.pause)
        stall.start()
        threading.Timer(3.5, inner.resume).start()
        out = _round(gw, 1)
        failed = [s for s in out if s.agent["error"]]  # type: ignore[index]
        assert failed, "an engine stalled for 3.3 s past a 1.5 s agent_timeout_s must fail episodes"
        for s in failed:  # the agent's own limit, or its call's wait on the engine (a 503 it raised on)
            assert "rollout.gateway.agent_timeout_s" in s.agent["error"], s.agent["error"]  # type: ignore[index]
        time.sleep(3.5)  # the stall is over; the abandoned calls are sampled at the next round's start
        out = _round(gw, 2)
        assert [s.agent["error"] for s in out if s.agent["error"]] == []  # type: ignore[index]
        assert gw._by_call == {} and inner.num_pending() == 0
    finally:
        gw.shutdown()
