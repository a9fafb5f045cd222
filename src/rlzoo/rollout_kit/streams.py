"""A rollout backend's finished-sample stream, read the same way by every backend.

``stream`` yields finished samples until nothing is pending or ``timeout`` seconds pass without
one. ``generate`` submits, then takes finished samples until all of the requested ones arrived,
handing the others back to the stream for whoever consumes it, and returns them in request order,
then sample index. A backend whose finished samples wait in a queue that its own thread fills
(simulated, vLLM) has both whole: :func:`queue_stream` and :func:`queue_generate`, with a
:class:`PendingCount` of the samples not delivered yet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

from rlzoo.kernel.protocols import GenerationRequest, Sample

#: how long one poll of a backend's finished-sample queue waits (seconds)
POLL_S = 0.05


def stream_samples(
    next_sample: Callable[[float | None], Sample | None],
    finished: Callable[[], bool],
    delivered: Callable[[], None],
    timeout: float | None = None,
) -> Iterator[Sample]:
    """Yield ``next_sample(wait)`` results until ``finished()`` or ``timeout`` s pass without one.

    ``next_sample`` gets the seconds left before the timeout (None: no timeout) and returns None
    when no sample came within its own poll; ``delivered`` is called once per yielded sample.
    """
    last = time.monotonic()
    while True:
        remaining = None if timeout is None else timeout - (time.monotonic() - last)
        if remaining is not None and remaining < 0:
            return
        s = next_sample(remaining)
        if s is None:
            if finished():
                return
            continue
        delivered()
        last = time.monotonic()
        yield s


def poll_wait(remaining: float | None) -> float:
    """One poll's wait, never past the caller's timeout."""
    return POLL_S if remaining is None else max(0.0, min(POLL_S, remaining))


def requested_keys(requests: Sequence[GenerationRequest]) -> tuple[list[str], set[tuple[str, int]]]:
    """Request ids (checked unique) and the ``(request_id, index)`` of every sample they ask for."""
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("generate(): request ids must be unique")
    return ids, {(r.request_id, i) for r in requests for i in range(r.sampling.n)}


def collect_requested(
    requests: Sequence[GenerationRequest],
    next_sample: Callable[[], Sample | None],
    requeue: Callable[[Sample], None],
    delivered: Callable[[], None] = lambda: None,
) -> list[Sample]:
    """Take samples from ``next_sample()`` (None: nothing yet) until every requested one arrived.

    Samples of other requests go back through ``requeue`` (also when this raises); ``delivered``
    is called once per requested sample. Returns them in request order, then sample index.
    """
    ids, wanted = requested_keys(requests)
    got: dict[tuple[str, int], Sample] = {}
    others: list[Sample] = []
    try:
        while len(got) < len(wanted):
            s = next_sample()
            if s is None:
                continue
            if (s.request_id, s.index) in wanted:
                got[(s.request_id, s.index)] = s
                delivered()
            else:
                others.append(s)
    finally:
        for s in others:
            requeue(s)
    order = {rid: k for k, rid in enumerate(ids)}
    return sorted(got.values(), key=lambda s: (order[s.request_id], s.index))


class PendingCount:
    """Samples submitted but not yet delivered to a consumer (``num_pending()``), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._submitted = 0
        self._delivered = 0

    def submitted(self, n: int = 1) -> None:
        with self._lock:
            self._submitted += n

    def delivered(self) -> None:
        with self._lock:
            self._delivered += 1

    def pending(self) -> int:
        with self._lock:
            return self._submitted - self._delivered


def queue_stream(
    poll: Callable[[float], Sample | None],
    pending: Callable[[], int],
    delivered: Callable[[], None],
    timeout: float | None = None,
) -> Iterator[Sample]:
    """``stream(timeout)`` of a backend whose finished samples wait in a queue: ``poll(wait)`` takes
    one (None: none came within ``wait`` s, one poll at most); it ends once ``pending()`` is 0."""
    return stream_samples(
        lambda remaining: poll(poll_wait(remaining)), lambda: pending() == 0, delivered, timeout
    )


def queue_generate(
    requests: Sequence[GenerationRequest],
    paused: bool,
    submit: Callable[[Sequence[GenerationRequest]], None],
    poll: Callable[[float], Sample | None],
    requeue: Callable[[Sample], None],
    delivered: Callable[[], None],
) -> list[Sample]:
    """``generate(requests)`` of a backend whose own thread fills its finished-sample queue: the ids
    checked before anything is submitted, refused while ``paused`` (it would never finish), then
    :func:`collect_requested` with ``poll(POLL_S)``."""
    requested_keys(requests)
    if paused:
        raise RuntimeError("generate() while paused would never finish: call resume() first")
    submit(requests)
    return collect_requested(requests, lambda: poll(POLL_S), requeue, delivered)
