"""Bucketed weight transfer: exact round trips (in-process and over a real gloo group)."""

from __future__ import annotations

import collections
import threading

import pytest
import torch

from rlzoo.distributed.weight_sync import (
    ALIGN,
    SyncStats,
    TorchSyncGroup,
    flatten_bucket,
    free_port,
    iter_buckets,
    receive_weights,
    send_weights,
)


def _state_dict() -> list[tuple[str, torch.Tensor]]:
    """Odd sizes, 0-d and empty tensors, mixed dtypes (bit patterns must survive exactly)."""
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(7, 13, generator=g)),  # 91 fp32 = 364 bytes (not a multiple of 16)
        ("a.bias", torch.randn(13, generator=g).to(torch.bfloat16)),  # 26 bytes
        ("scalar", torch.tensor(3.5, dtype=torch.float64)),  # 0-d
        ("half", torch.randn(3, 5, 1, generator=g).half()),
        ("ids", torch.randint(-(2**40), 2**40, (11,), generator=g)),  # int64
        ("mask", torch.rand(17, generator=g) > 0.5),  # bool
        ("empty", torch.empty(0, 4)),
        ("big", torch.randn(1000, generator=g)),  # 4000 bytes: alone in small buckets
        ("nonc", torch.randn(6, 4, generator=g).t()),  # non-contiguous
        ("nan", torch.tensor([float("nan"), float("inf"), -0.0])),
    ]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bool(
        torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))
    )


class _Loopback:
    """An in-process 'broadcast': rank 0's calls are queued, the receiver's calls copy them out."""

    def __init__(self) -> None:
        self.q: collections.deque[torch.Tensor] = collections.deque()

    def send(self, t: torch.Tensor) -> None:
        self.q.append(t.clone())

    def recv(self, t: torch.Tensor) -> None:
        src = self.q.popleft()
        assert src.shape == t.shape and src.dtype == t.dtype
        t.copy_(src)


@pytest.mark.parametrize("bucket_bytes", [1, 64, 1000, 4096, 1 << 20])
def test_round_trip_is_exact(bucket_bytes: int) -> None:
    sd = _state_dict()
    wire = _Loopback()
    sent_stats, recv_stats = SyncStats(), SyncStats()
    echoed = list(send_weights(iter(sd), wire.send, bucket_bytes, stats=sent_stats))
    got = list(receive_weights(wire.recv, stats=recv_stats))
    assert not wire.q
    assert [n for n, _ in got] == [n for n, _ in sd] == [n for n, _ in echoed]
    for (name, want), (_, have), (_, echo) in zip(sd, got, echoed):
        assert _same(want, have), name
        assert _same(want, echo), name
    assert sent_stats.bytes == recv_stats.bytes and sent_stats.buckets == recv_stats.buckets
    # payload = the tensors' bytes, each rounded up to 16: e.g. a.weight 364 -> 368
    assert sent_stats.bytes == sum((t.numel() * t.element_size() + ALIGN - 1) // ALIGN * ALIGN for _, t in sd)


def test_bucketing_respects_the_size_and_keeps_order() -> None:
    sd = _state_dict()
    buckets = list(iter_buckets(iter(sd), 1000))
    assert [n for b in buckets for n, _ in b] == [n for n, _ in sd]
    for b in buckets:
        _, meta = flatten_bucket(b)
        size = flatten_bucket(b)[0].numel()
        assert size <= 1000 or len(b) == 1  # only a tensor larger than the bucket travels alone
        assert all(off % ALIGN == 0 for *_, off in meta)
    # "big" (4000 bytes) is alone in its bucket
    assert next(b for b in buckets if any(n == "big" for n, _ in b))[0][0] == "big"


def test_iteration_is_lazy() -> None:
    pulled: list[str] = []

    def export():
        for n, t in _state_dict():
            pulled.append(n)
            yield n, t

    wire = _Loopback()
    it = send_weights(export(), wire.send, 400)
    assert pulled == []  # nothing exported before the consumer asks
    next(it)
    # bucket 1 = a.weight (364 -> 368 bytes) + a.bias (26 -> 32) = 400; "scalar" is pulled to find it full
    assert pulled == ["a.weight", "a.bias", "scalar"]


def test_over_a_real_gloo_group() -> None:
    """Two members of a TorchSyncGroup (threads of this process) over gloo, 3 bucket sizes."""
    sd = _state_dict()
    port = free_port()
    groups: dict[int, TorchSyncGroup] = {}

    def make(rank: int) -> None:
        groups[rank] = TorchSyncGroup("127.0.0.1", port, rank, 2, timeout_s=60)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(groups) == {0, 1}
    for bucket in (64, 1000, 1 << 20):
        got: list[tuple[str, torch.Tensor]] = []

        def receive(into: list[tuple[str, torch.Tensor]] = got) -> None:
            into.extend((n, t.clone()) for n, t in groups[1].receive())

        rx = threading.Thread(target=receive)
        rx.start()
        for _ in groups[0].send(iter(sd), bucket):
            pass
        rx.join(60)
        assert [n for n, _ in got] == [n for n, _ in sd]
        assert all(_same(a, b) for (_, a), (_, b) in zip(sd, got))
