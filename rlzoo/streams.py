"""Collecting the samples of some requests out of a rollout backend's shared finished-sample stream.

Every rollout backend implements ``generate`` the same way on top of its stream: submit, then take
finished samples until all of the requested ones arrived, handing the others back to the stream
for whoever consumes it, and return them in request order, then sample index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlzoo.protocols import GenerationRequest, Sample


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
