"""Fixtures of the gateway tests: SmolLM2's real BPE tokenizer and a tiny random Qwen2 over it (the
multi-turn exactness tests' setup, tests/agents), a native engine and trainer, and the gateway."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from agents.conftest import smollm2_tokenizer  # noqa: F401  (the fixture, shared)
from agents.test_exactness_bpe import bpe_parts  # noqa: F401  (the fixture, shared)

from rlzoo.gateway.rollout import call_number
from rlzoo.kernel.protocols import GenerationRequest, Sample


class Recorder:
    """The engine, recording every sample it produced by request id (what the engine sampled)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.samples: dict[str, Sample] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        for s in self.inner.stream(timeout):
            self.samples[s.request_id] = s
            yield s


class ScriptedCalls:
    """An engine that answers call k of a gateway episode (its request id's ``#g<k>``) with
    :meth:`ids` (the stop token included), log-prob -0.5 a token, version 0; ``seen`` holds every
    request it got. Deterministic, instant."""

    def __init__(self) -> None:
        self.version = 0
        self.queue: list[Sample] = []
        self.seen: list[GenerationRequest] = []

    def ids(self, request: GenerationRequest, call: int) -> list[int]:
        raise NotImplementedError

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        for r in requests:
            self.seen.append(r)
            ids = self.ids(r, call_number(r.request_id))
            self.queue.append(Sample.of_request(r, 0, ids, [-0.5] * len(ids), [0] * len(ids), "stop"))

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        while self.queue:
            yield self.queue.pop(0)

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def shutdown(self) -> None: ...


class FnAgent:
    """An agent part from a plain function ``fn(client, row) -> AgentResult``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def run(self, client: Any, row: Any) -> Any:
        return self.fn(client, row)


@pytest.fixture
def make_gateway(bpe_parts: dict[str, Any]) -> Iterator[Callable[..., Any]]:  # noqa: F811
    """``make_gateway(fn, **settings) -> (GatewayRollout, Recorder)`` over a fresh native engine."""
    from rlzoo.agents.settings import MultiTurnSettings
    from rlzoo.gateway.rollout import GatewayRollout
    from rlzoo.gateway.settings import GatewaySettings

    built: list[Any] = []

    def make(
        fn: Callable[..., Any],
        *,
        multi_turn: MultiTurnSettings | None = None,
        max_response_length: int = 200,
        **settings: Any,
    ) -> tuple[Any, Recorder]:
        rec = Recorder(bpe_parts["make_inner"]())
        gw = GatewayRollout(
            rec,  # type: ignore[arg-type]
            lambda: FnAgent(fn),
            bpe_parts["tok"],
            GatewaySettings(**{"agent_timeout_s": 60.0, **settings}),
            multi_turn or MultiTurnSettings(max_turns=8, per_turn_max_tokens=40),
            max_response_length=max_response_length,
            max_prompt_length=256,
            stop_ids=(bpe_parts["eos"],),
            agent_name="test",
        )
        built.append(gw)
        return gw, rec

    yield make
    for gw in built:
        gw.shutdown()
