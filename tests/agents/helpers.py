"""Shared helpers of the multi-turn exactness tests."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rlzoo.kernel.protocols import AgentTurn, EnvStep, GenerationRequest, Sample, SamplingParams, Tool


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


def requests(n_prompts: int = 6, n: int = 4) -> list[GenerationRequest]:
    sp = SamplingParams(n=n, temperature=1.0, max_new_tokens=160, seed=11)
    return [
        GenerationRequest(request_id=f"p{i}", prompt_ids=[0], sampling=sp, data={"index": i})
        for i in range(n_prompts)
    ]


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of 1s in ``mask``: a trajectory's model turns in its loss mask."""
    out, start = [], None
    for j, m in enumerate([*mask, 0]):
        if m and start is None:
            start = j
        elif not m and start is not None:
            out.append((start, j))
            start = None
    return out


def _segments(s: Sample) -> list[tuple[int, int]]:
    """(start, end) of each run of loss-mask-1 positions: the model's turns."""
    return mask_runs(s.loss_mask or [])


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


class ScriptedBackend:
    """A rollout backend that "samples" scripted text: ``script(turn, prompt_text) -> text`` per
    turn, encoded and closed with EOS (log-prob -1.0 a token, version 0). Deterministic, instant."""

    def __init__(self, tokenizer: Any, script: Any, eos: int) -> None:
        self.tok, self.script, self.eos = tokenizer, script, eos
        self.version = 0
        self._queue: list[Sample] = []

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        for r in requests:
            turn = int(r.request_id.rsplit("#t", 1)[1])
            text = self.script(turn, self.tok.decode(r.prompt_ids))
            ids = [*self.tok(text, add_special_tokens=False)["input_ids"], self.eos][
                : r.sampling.max_new_tokens
            ]
            reason = "stop" if ids[-1] == self.eos else "length"
            self._queue.append(Sample.of_request(r, 0, ids, [-1.0] * len(ids), [0] * len(ids), reason))

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        while self._queue:
            yield self._queue.pop(0)

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def shutdown(self) -> None: ...
