"""The staleness-aware queue: window budget, version bound, drops, failures (no torch, no model)."""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlzoo.sources.params import max_staleness_versions, window_budget
from rlzoo.sources.queue import Group, QueueExhausted, RolloutFailed, StalenessQueue, TrainerFailed


def test_window_budget_matches_verl_formula() -> None:
    # geo3k seed run: floor((1 + 0.1) * 4 * (2 * 128)) = floor(1126.4) = 1126 prompts per window
    assert window_budget(0.1, 4, 2 * 128) == 1126
    # dapo seed run: floor(1.1 * 4 * (4 * 32)) = floor(563.2) = 563
    assert window_budget(0.1, 4, 4 * 32) == 563
    assert window_budget(0.0, 1, 16) == 16  # on-policy: exactly one step's worth
    assert [max_staleness_versions(s) for s in (0.0, 0.1, 0.5, 1.0, 1.5, 2.0)] == [0, 1, 1, 1, 2, 2]


def test_budget_blocks_admission_until_a_push() -> None:
    q = StalenessQueue(budget=3, max_staleness=1)
    assert [q.try_acquire() for _ in range(4)] == [True, True, True, False]
    for i in range(3):
        q.put(Group(seq=i, version=0, max_version=0, n_samples=2, payload=i))
    assert not q.try_acquire()  # queued groups still count in the window
    assert [g.payload for g in q.get(2, timeout=1)] == [0, 1]
    assert not q.try_acquire()  # consumed groups too, until the next push
    q.on_sync(1)  # carried: 1 queued -> window_started = 1
    assert q.window_started == 1
    assert [q.try_acquire() for _ in range(3)] == [True, True, False]


def test_a_push_reports_what_it_carried_complete_and_in_flight() -> None:
    q = StalenessQueue(budget=6, max_staleness=1)
    assert all(q.try_acquire() for _ in range(6))  # 6 in flight
    q.put(Group(seq=1, version=0, max_version=0, n_samples=4, payload="a"))
    q.put(Group(seq=2, version=0, max_version=0, n_samples=4, payload="b"))  # 4 in flight, 2 queued
    assert [g.payload for g in q.get(1, timeout=1)] == ["a"]  # 1 queued
    assert q.snapshot()["queue/carried_queued"] == 0.0  # no push yet
    q.on_sync(1)
    snap = q.snapshot()
    assert (snap["queue/carried_queued"], snap["queue/carried_in_flight"]) == (1.0, 4.0)
    assert q.window_started == 5
    q.put(Group(seq=3, version=0, max_version=1, n_samples=4, payload="c"))  # 3 in flight, 2 queued
    q.on_sync(2)  # "b" and "c" (version 0) are now 2 versions old: purged, not carried
    snap = q.snapshot()
    assert (snap["queue/carried_queued"], snap["queue/carried_in_flight"]) == (0.0, 3.0)


def test_stale_groups_are_dropped_and_regenerated() -> None:
    q = StalenessQueue(budget=10, max_staleness=1)
    for _ in range(3):
        assert q.try_acquire()
    q.put(Group(seq=1, version=0, max_version=0, n_samples=4, payload="a"))
    q.on_sync(1)
    q.on_sync(2)  # "a" is now 2 versions old: purged at the push
    assert q.size() == 0 and q.counters["dropped_samples"] == 4
    assert q.put(Group(seq=2, version=0, max_version=2, n_samples=4, payload="b")) is False  # stale at put
    assert q.counters["dropped_groups"] == 2
    assert q.acquire_regen() == "a" and q.acquire_regen() == "b"
    assert q.put(Group(seq=3, version=1, max_version=2, n_samples=4, payload="c"))
    assert [g.payload for g in q.get(1, timeout=1)] == ["c"]


def test_get_takes_stalest_first_and_raises_when_exhausted() -> None:
    q = StalenessQueue(budget=10, max_staleness=2)
    for _ in range(3):
        q.try_acquire()
    q.on_sync(1)
    q.put(Group(seq=1, version=1, max_version=1, n_samples=1, payload="new"))
    q.put(Group(seq=2, version=0, max_version=1, n_samples=1, payload="old"))
    assert [g.payload for g in q.get(1, timeout=1)] == ["old"]
    q.cancel()
    q.drawing_done()
    assert [g.payload for g in q.get(1, timeout=1)] == ["new"]
    with pytest.raises(QueueExhausted):
        q.get(1, timeout=1)


def test_failures_reach_the_other_side_promptly() -> None:
    q = StalenessQueue(budget=4, max_staleness=0)
    boom = ValueError("scorer exploded")
    threading.Timer(0.1, q.fail, args=(boom, "rollouter")).start()
    t0 = time.monotonic()
    with pytest.raises(RolloutFailed) as info:
        q.get(1, timeout=30)
    assert info.value.__cause__ is boom and time.monotonic() - t0 < 2
    q2 = StalenessQueue(budget=4, max_staleness=0)
    q2.fail(KeyError("trainer"), "trainer")
    with pytest.raises(TrainerFailed):
        q2.try_acquire()


def test_get_times_out_without_progress() -> None:
    q = StalenessQueue(budget=4, max_staleness=0)
    with pytest.raises(TimeoutError, match="wait_timeout_s"):
        q.get(1, timeout=0.2)


# ---------------------------------------------------------------------------------------------
# Property: the bounds hold under random timings (a simulated rollouter with random delays)
# ---------------------------------------------------------------------------------------------
def _simulate(seed: int, s: float, K: int, step_groups: int, partial: bool, steps: int) -> dict[str, object]:
    rng = random.Random(seed)
    budget, max_stale = window_budget(s, K, step_groups), max_staleness_versions(s)
    q = StalenessQueue(budget=budget, max_staleness=max_stale)
    durations = [rng.choice([0.0005, 0.001, 0.002, 0.02]) for _ in range(4096)]  # long tail
    started: list[int] = []
    max_window = [0]

    def rollouter() -> None:
        running: list[tuple[float, int, int]] = []  # (finish time, prompt id, version at start)
        next_id = 0
        try:
            while not q.stopped:
                regen = q.acquire_regen()
                if regen is not None:
                    pid = regen
                elif q.try_acquire():
                    pid, next_id = next_id, next_id + 1
                    started.append(pid)
                else:
                    pid = None
                max_window[0] = max(max_window[0], q.window_started)
                if pid is not None:
                    running.append((time.monotonic() + durations[pid % len(durations)], pid, q.param_version))
                    continue
                now = time.monotonic()
                for item in sorted(r for r in running if r[0] <= now):
                    running.remove(item)
                    # partial rollout: tokens from the start version up to now; else one version
                    q.put(
                        Group(
                            seq=item[1],
                            version=item[2],
                            max_version=q.param_version,
                            n_samples=2,
                            payload=item[1],
                        )
                    )
                time.sleep(0.0002)
        except TrainerFailed:
            return

    t = threading.Thread(target=rollouter, daemon=True)
    t.start()
    trained: list[int] = []
    staleness: list[int] = []
    try:
        for step in range(1, steps + 1):
            groups = q.get(step_groups, timeout=10)
            staleness += q.staleness_of(groups)
            trained += [g.payload for g in groups]
            time.sleep(rng.choice([0.0, 0.001, 0.005]))
            if step % K == 0:
                if not partial:
                    q.hold()
                    q.wait_drained(timeout=10)
                q.on_sync(q.param_version + 1)
                q.release()
    finally:
        q.stop()
        t.join(5)
    return {
        "trained": trained,
        "staleness": staleness,
        "max_stale": max_stale,
        "budget": budget,
        "max_window": max(max_window[0], int(q.counters["max_window_started"])),
        "started": started,
    }


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    s=st.sampled_from([0.0, 0.1, 0.5, 1.0, 1.7]),
    K=st.integers(1, 3),
    step_groups=st.integers(1, 4),
    partial=st.booleans(),
)
def test_staleness_bounds_hold_under_random_timings(
    seed: int, s: float, K: int, step_groups: int, partial: bool
) -> None:
    out = _simulate(seed, s, K, step_groups, partial, steps=6)
    trained, staleness = out["trained"], out["staleness"]
    assert isinstance(trained, list) and isinstance(staleness, list) and isinstance(out["started"], list)
    assert len(trained) == 6 * step_groups
    assert max(staleness) <= out["max_stale"]  # invariant 2: versions
    assert out["max_window"] <= out["budget"]  # invariant 1: samples per window
    assert len(set(trained)) == len(trained)  # no prompt trained twice (dropped ones are regenerated)
    assert set(trained) <= set(out["started"])
    if s == 0.0:
        assert set(staleness) == {0}  # on-policy pipelining
