"""Simulated rollout and train backends: real threads and real wall-clock time, no model.

The cost model (params in :mod:`rlzoo.backends.simulated`):

- **rollout**: continuous batching over ``devices * slots_per_device`` slots; one decode step costs
  ``decode_step_s`` whatever the number of running sequences (memory-bound decode), and produces
  one token for each of them. A finished sequence leaves its slot at once and a waiting one joins.
  A batch-synchronous caller (``generate``) therefore waits for its longest response: the long
  tail of the log-normal length distribution holds the whole batch.
- **train**: time proportional to tokens (``attention_mask.sum()``), divided by ``devices``.

Both satisfy the :class:`~rlzoo.kernel.protocols.RolloutBackend` / :class:`~rlzoo.kernel.protocols.TrainBackend`
protocols the runners use, with the semantics of the native backends (see
:class:`rlzoo.backends.native.rollout.NativeRolloutBackend`).
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import json
import math
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlzoo.backends.simulated import SimulatedRolloutParams, SimulatedTrainParams
from rlzoo.kernel.protocols import GenerationRequest, Sample
from rlzoo.kernel.settings import RolloutSpec, TrainSpec
from rlzoo.rollout_kit.streams import PendingCount, queue_generate, queue_stream

__all__ = ["SimulatedRolloutBackend", "SimulatedTrainBackend"]


def _mix(*parts: object) -> int:
    return int.from_bytes(
        hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest(), "little"
    )


@dataclass(eq=False)
class _Seq:
    request: GenerationRequest
    index: int
    length: int  # tokens it will produce
    capped: bool  # length hit max_new_tokens
    seed: int
    start: int = -1  # engine step that produced its first token
    order: int = 0
    done: bool = field(default=False)


class SimulatedRolloutBackend:
    """See :class:`rlzoo.backends.simulated.SimulatedRolloutParams`."""

    def __init__(self, params: SimulatedRolloutParams, spec: RolloutSpec) -> None:
        self.params = params
        self.spec = spec
        self.slots = max(1, params.devices * params.slots_per_device)
        self.version = 0
        self._changes_step: list[int] = [0]  # engine step from which ...
        self._changes_ver: list[int] = [0]  # ... this version produces the tokens
        self._step = 0
        self._running: list[tuple[int, int, _Seq]] = []  # heap of (finish step, order, seq)
        self._waiting: deque[_Seq] = deque()
        self._inbox: deque[_Seq] = deque()
        self._out: queue.Queue[Sample] = queue.Queue()
        self._cv = threading.Condition()
        self._step_lock = threading.RLock()
        self._count = PendingCount()
        self._num_requests = 0
        self._order = 0
        self._paused = False
        self._stop = False
        self._error: BaseException | None = None
        self.stats = {"steps": 0, "tokens": 0, "busy_s": 0.0}
        self._thread = threading.Thread(target=self._loop, name="rlzoo-simulated-rollout", daemon=True)
        self._thread.start()

    # -- protocol ---------------------------------------------------------------------------------
    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        if self._stop:
            raise RuntimeError("the simulated rollout backend was shut down")
        with self._cv:
            for req in requests:
                number = self._num_requests
                self._num_requests += 1
                sp = req.sampling
                max_new = min(sp.max_new_tokens, self.spec.max_response_length)
                for i in range(sp.n):
                    seed = _mix(self.spec.seed, sp.seed if sp.seed is not None else f"auto{number}", i)
                    length, capped = self._draw_length(seed, max_new)
                    self._inbox.append(_Seq(req, i, length, capped, seed))
                    self._count.submitted()
            self._cv.notify_all()

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        yield from queue_stream(self._next, self._count.pending, self._count.delivered, timeout)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Sample]:
        return queue_generate(
            requests, self._paused, self.submit, self._next, self._out.put, self._count.delivered
        )

    def pause(self) -> None:
        with self._cv:
            self._paused = True
        with self._step_lock:
            pass

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        for _ in named_tensors:
            pass
        with self._step_lock:
            if self.params.update_weights_s > 0:
                time.sleep(self.params.update_weights_s)
            self.version = int(version)
            if self._changes_step[-1] == self._step:
                self._changes_ver[-1] = self.version
            else:
                self._changes_step.append(self._step)
                self._changes_ver.append(self.version)

    def abort(self, request_ids: Iterable[str] | None = None) -> int:
        ids = None if request_ids is None else set(request_ids)
        with self._step_lock:
            with self._cv:
                self._waiting.extend(self._inbox)
                self._inbox.clear()
            hit = [s for s in self._waiting if ids is None or s.request.request_id in ids]
            self._waiting = deque(s for s in self._waiting if s not in hit)
            for s in hit:
                self._out.put(self._sample(s, 0, "abort"))
            rows = [e for e in self._running if ids is None or e[2].request.request_id in ids]
            self._running = [e for e in self._running if e not in rows]
            heapq.heapify(self._running)
            for _, _, s in rows:
                self._out.put(self._sample(s, self._step - s.start, "abort"))
        return len(hit) + len(rows)

    def num_pending(self) -> int:
        return self._count.pending()

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    # -- engine -----------------------------------------------------------------------------------
    def _draw_length(self, seed: int, max_new: int) -> tuple[int, bool]:
        p = self.params
        rng = random.Random(seed)
        sigma = max(p.sigma, 1e-6)
        mu = math.log(max(p.mean_response_length, 1.0)) - sigma * sigma / 2  # mean of the log-normal
        n = max(1, round(rng.lognormvariate(mu, sigma)))
        return (max_new, True) if n >= max_new else (n, False)

    def _has_work(self) -> bool:
        return bool(self._inbox or self._waiting or self._running)

    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._stop and (self._paused or not self._has_work()):
                        self._cv.wait()
                    if self._stop:
                        return
                self._one_step()
        except BaseException as e:  # surfaced by stream() / generate()
            self._error = e

    def _one_step(self) -> None:
        with self._step_lock:
            with self._cv:
                if self._paused:
                    return
                self._waiting.extend(self._inbox)
                self._inbox.clear()
            while self._waiting and len(self._running) < self.slots:
                s = self._waiting.popleft()
                s.start = self._step
                self._order += 1
                heapq.heappush(self._running, (s.start + s.length, self._order, s))
            if not self._running:
                return
            t0 = time.perf_counter()
            time.sleep(self.params.decode_step_s)
            self.stats["busy_s"] += time.perf_counter() - t0
            self.stats["steps"] += 1
            self.stats["tokens"] += len(self._running)
            self._step += 1
            while self._running and self._running[0][0] <= self._step:
                _, _, s = heapq.heappop(self._running)
                self._out.put(self._sample(s, s.length, "length" if s.capped else "stop"))

    def _sample(self, s: _Seq, n_tokens: int, reason: str) -> Sample:
        rng = random.Random(s.seed + 1)
        p = self.params
        tokens = [rng.randrange(p.token_low, p.token_high) for _ in range(n_tokens)]
        log_probs = [-0.5 - rng.random() for _ in range(n_tokens)]
        versions = [
            self._changes_ver[bisect.bisect_right(self._changes_step, s.start + i) - 1]
            for i in range(n_tokens)
        ]
        return Sample.of_request(s.request, s.index, tokens, log_probs, versions, reason)

    def _next(self, wait: float) -> Sample | None:
        try:
            return self._out.get(timeout=wait) if wait > 0 else self._out.get_nowait()
        except queue.Empty:
            if self._error is not None:
                raise RuntimeError("the simulated rollout thread failed") from self._error
            return None


class SimulatedTrainBackend:
    """See :class:`rlzoo.backends.simulated.SimulatedTrainParams`."""

    def __init__(self, params: SimulatedTrainParams, spec: TrainSpec) -> None:
        self.params = params
        self.spec = spec
        self.version = 0
        self.busy_s = 0.0

    def _burn(self, tokens: float, per_token: float) -> None:
        t = tokens * per_token / max(1, self.params.devices)
        if t > 0:
            t0 = time.perf_counter()
            time.sleep(t)
            self.busy_s += time.perf_counter() - t0

    def compute_log_probs(
        self, batch: Any, *, model: str = "actor", with_entropy: bool = False
    ) -> tuple[Any, Any]:
        self._burn(float(batch["attention_mask"].sum()), self.params.forward_s_per_token)
        lp = batch["rollout_log_probs"].clone()  # [B, T]
        return lp, (torch.zeros_like(lp) if with_entropy else None)

    def compute_values(self, batch: Any) -> Any:
        self._burn(float(batch["attention_mask"].sum()), self.params.forward_s_per_token)
        return torch.zeros_like(batch["rollout_log_probs"])  # [B, T]

    def update_policy(self, mini_batch: Any, objective: Any) -> dict[str, float]:
        self._burn(float(mini_batch["attention_mask"].sum()), self.params.update_s_per_token)
        lp = mini_batch["rollout_log_probs"].clone().requires_grad_(True)  # [b, T]
        _, metrics = objective(mini_batch, lp, torch.zeros_like(lp))
        self.version += 1
        out = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) or hasattr(v, "item")}
        out["actor/lr"] = 0.0
        return out

    def update_critic(self, mini_batch: Any, objective: Any) -> dict[str, float]:
        self._burn(float(mini_batch["attention_mask"].sum()), self.params.update_s_per_token)
        return {}

    def export_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        if self.params.export_s > 0:
            time.sleep(self.params.export_s)
        return [("version", torch.tensor([float(self.version)]))]

    def save_checkpoint(self, path: Path, extra_state: Mapping[str, Any]) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        # "weights": a file as large as a model shard would be, written in two halves with the
        # configured write time between them (so tests can kill a process mid-write)
        half = max(0, self.params.checkpoint_bytes // 2)
        with open(path / "weights.bin", "wb") as fh:
            fh.write(bytes(half))
            fh.flush()
            if self.params.checkpoint_s > 0:
                time.sleep(self.params.checkpoint_s)
            fh.write(bytes(self.params.checkpoint_bytes - half))
        (path / "simulated.json").write_text(
            json.dumps({"version": self.version, "extra_state": dict(extra_state)})
        )

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        state = json.loads((Path(path) / "simulated.json").read_text())
        self.version = int(state["version"])
        return dict(state["extra_state"])

    def shutdown(self) -> None:
        return None
