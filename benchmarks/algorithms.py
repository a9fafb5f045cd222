"""Benchmark the advantage estimators (and policy losses) against per-sample Python loops.

    python benchmarks/algorithms.py [--sizes 4096,65536] [--tokens 1024] [--group-size 8] [--quick]

For every advantage estimator registered by rlzoo, times the vectorised implementation next to a
straightforward loop implementation of the same formula, written here the way verl's
``core_algos.py`` writes it (a dict of per-group lists filled sample by sample, per-group
``torch.stack`` / ``mean`` / ``std``, per-sample assignment). For GAE and REINFORCE++ the loop is
verl's loop over time steps on ``[:, t]`` columns (a per-sample, per-token Python loop would take
hours at 64k x 1k). Policy losses from ``rlzoo.algorithms.functional.policy_loss`` (if present)
are timed at the smallest size, vectorised only. Prints one table: part, N, vectorised ms, loop
ms, speed-up. CPU, float32; 64k x 1k is 256 MB per tensor.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

import rlzoo
from rlzoo.kernel.protocols import AdvantageInputs

# ---------------------------------------------------------------------------------------------
# loop baselines (verl's formulas, one sample / one group at a time)
# ---------------------------------------------------------------------------------------------


def _loop_group_lists(scores: torch.Tensor, index: list[int]) -> dict[int, list[torch.Tensor]]:
    id2score: dict[int, list[torch.Tensor]] = defaultdict(list)
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    return id2score


def loop_grpo(inp: AdvantageInputs, eps: float = 1e-6) -> torch.Tensor:
    scores = inp.token_level_rewards.sum(-1)
    index = inp.group_ids.tolist()
    id2score = _loop_group_lists(scores, index)
    mean, std = {}, {}
    for k, v in id2score.items():
        if len(v) == 1:
            mean[k], std[k] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            t = torch.stack(v)
            mean[k], std[k] = t.mean(), t.std()
    for i in range(scores.shape[0]):
        scores[i] = (scores[i] - mean[index[i]]) / (std[index[i]] + eps)
    return scores.unsqueeze(-1) * inp.response_mask


def loop_rloo(inp: AdvantageInputs) -> torch.Tensor:
    scores = inp.token_level_rewards.sum(-1)
    index = inp.group_ids.tolist()
    id2score = _loop_group_lists(scores, index)
    mean = {k: torch.tensor(0.0) if len(v) == 1 else torch.stack(v).mean() for k, v in id2score.items()}
    for i in range(scores.shape[0]):
        n = len(id2score[index[i]])
        if n > 1:
            scores[i] = scores[i] * n / (n - 1) - mean[index[i]] * n / (n - 1)
    return scores.unsqueeze(-1) * inp.response_mask


def loop_opo(inp: AdvantageInputs) -> torch.Tensor:
    lengths = inp.response_mask.sum(-1)
    scores = inp.token_level_rewards.sum(-1)
    index = inp.group_ids.tolist()
    id2score, id2len = defaultdict(list), defaultdict(list)
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
        id2len[index[i]].append(lengths[i])
    bsl = {}
    for k, v in id2score.items():
        if len(v) == 1:
            bsl[k] = torch.tensor(0.0)
        else:
            s, n = torch.stack(v), torch.stack(id2len[k])
            bsl[k] = (n * s).sum() / n.sum()
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - bsl[index[i]]
    return scores.unsqueeze(-1) * inp.response_mask


def loop_gpg(inp: AdvantageInputs) -> torch.Tensor:
    scores = inp.token_level_rewards.sum(-1)
    index = inp.group_ids.tolist()
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    id2score = _loop_group_lists(scores, index)
    mean = {k: torch.tensor(0.0) if len(v) == 1 else torch.stack(v).mean() for k, v in id2score.items()}
    for i in range(scores.shape[0]):
        scores[i] = alpha * (scores[i] - mean[index[i]])
    return scores.unsqueeze(-1) * inp.response_mask


def loop_grpo_passk(inp: AdvantageInputs, eps: float = 1e-6) -> torch.Tensor:
    scores = inp.token_level_rewards.sum(-1)
    adv = torch.zeros_like(scores)
    index = inp.group_ids.tolist()
    id2score, id2idx = defaultdict(list), defaultdict(list)
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
        id2idx[index[i]].append(i)
    for k, v in id2score.items():
        r = torch.stack(v)
        top, top_i = torch.topk(r, 2)
        adv[id2idx[k][top_i[0].item()]] = (top[0] - top[1]) / (torch.std(r) + eps)
    return adv.unsqueeze(-1) * inp.response_mask


def _masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n = mask.sum()
    mean = (values * mask).sum() / n
    var = ((values - mean) ** 2 * mask).sum() / n * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def loop_reinforce_plus_plus_baseline(inp: AdvantageInputs) -> torch.Tensor:
    t_len = inp.token_level_rewards.shape[-1]
    scores = inp.token_level_rewards.sum(-1)
    index = inp.group_ids.tolist()
    id2score = _loop_group_lists(scores, index)
    mean = {k: torch.tensor(0.0) if len(v) == 1 else torch.stack(v).mean() for k, v in id2score.items()}
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - mean[index[i]]
    scores = scores.unsqueeze(-1).tile([1, t_len]) * inp.response_mask
    return _masked_whiten(scores, inp.response_mask) * inp.response_mask


def loop_remax(inp: AdvantageInputs) -> torch.Tensor:
    rewards, mask = inp.token_level_rewards, inp.response_mask
    adv = torch.empty_like(rewards)
    for i in range(rewards.shape[0]):
        ret = (rewards[i] * mask[i]).flip(-1).cumsum(-1).flip(-1)
        adv[i] = ret - inp.baseline_rewards[i] * mask[i]
    return adv


def loop_gae(inp: AdvantageInputs, gamma: float = 1.0, lam: float = 1.0) -> torch.Tensor:
    r, v, m = inp.token_level_rewards, inp.values, inp.response_mask
    nextvalues, lastgaelam, rev = 0, 0, []
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * nextvalues - v[:, t]
        new = delta + gamma * lam * lastgaelam
        nextvalues = v[:, t] * m[:, t] + (1 - m[:, t]) * nextvalues
        lastgaelam = new * m[:, t] + (1 - m[:, t]) * lastgaelam
        rev.append(lastgaelam)
    adv = torch.stack(rev[::-1], dim=1)
    return _masked_whiten(adv, m)


def loop_reinforce_plus_plus(inp: AdvantageInputs, gamma: float = 1.0) -> torch.Tensor:
    r, m = inp.token_level_rewards, inp.response_mask
    returns = torch.zeros_like(r)
    running = 0
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + gamma * running
        returns[:, t] = running
        running = running * m[:, t]
    return _masked_whiten(returns, m) * m


GROUP_RELATIVE = {"grpo", "rloo", "opo", "gpg", "grpo_passk", "reinforce_plus_plus_baseline"}

LOOPS: dict[str, tuple[Callable[[AdvantageInputs], torch.Tensor], str]] = {
    "grpo": (loop_grpo, "per-sample"),
    "rloo": (loop_rloo, "per-sample"),
    "opo": (loop_opo, "per-sample"),
    "gpg": (loop_gpg, "per-sample"),
    "grpo_passk": (loop_grpo_passk, "per-group"),
    "reinforce_plus_plus_baseline": (loop_reinforce_plus_plus_baseline, "per-sample"),
    "remax": (loop_remax, "per-sample"),
    "gae": (loop_gae, "per-step"),
    "reinforce_plus_plus": (loop_reinforce_plus_plus, "per-step"),
}


# ---------------------------------------------------------------------------------------------
# harness
# ---------------------------------------------------------------------------------------------
def make_batch(n: int, t: int, group_size: int, seed: int = 0) -> AdvantageInputs:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)  # [N]
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).float()  # [N, T]
    rewards = torch.zeros(n, t)  # [N, T]
    rewards[torch.arange(n), lengths - 1] = torch.randint(0, 2, (n,), generator=g).float()
    # non-contiguous, shuffled group ids
    ids = (torch.arange(n) // group_size) * 7919 + 13  # [N]
    ids = ids[torch.randperm(n, generator=g)]
    return AdvantageInputs(
        token_level_rewards=rewards,
        response_mask=mask,
        group_ids=ids,
        values=torch.randn(n, t, generator=g) * 0.1,
        baseline_rewards=torch.rand(n, generator=g),
    )


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        out = None
        gc.collect()
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3, out


def bench_advantages(
    sizes: list[int], t: int, group_size: int, rows: list[tuple], only: set[str] | None = None
) -> None:
    reg = rlzoo.get_plugin_manager().registry("advantage")
    for n in sizes:
        batch = make_batch(n, t, group_size)
        repeat = 3 if n * t <= 2**24 else 1
        for comp in reg:
            if comp.plugin != "rlzoo.algorithms.advantage":
                continue  # third-party parts installed in this environment
            if only is not None and comp.name not in only:
                continue
            fn, params = comp.load(), comp.default_params()
            vec_ms, out = timed(lambda fn=fn, params=params, batch=batch: fn(batch, params), repeat)
            loop, kind = LOOPS.get(comp.name, (None, ""))
            loop_ms = speed = float("nan")
            if loop is not None:
                loop_ms, ref = timed(lambda loop=loop, batch=batch: loop(batch), 1)
                if not torch.allclose(ref * batch.response_mask, out.advantages, rtol=1e-3, atol=1e-3):
                    raise AssertionError(f"{comp.name}: vectorised and loop results differ at N={n}")
                speed = loop_ms / vec_ms
                del ref
            rows.append((f"advantage/{comp.name}", n, t, vec_ms, loop_ms, speed, kind))
            print(
                f"  advantage/{comp.name:30s} N={n:>6d}  {vec_ms:9.1f} ms  loop {loop_ms:9.1f} ms", flush=True
            )
            del out
        del batch
        gc.collect()


def bench_policy_losses(n: int, t: int, rows: list[tuple]) -> None:
    try:
        importlib.import_module("rlzoo.algorithms.functional.policy_loss")
        from rlzoo.kernel.protocols import PolicyLossInputs
    except ImportError as exc:  # written by another part of the project; optional here
        print(f"  (policy losses skipped: {exc})")
        return
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(n, t)
    log_probs = -torch.rand(n, t, generator=g)
    old = log_probs + 0.05 * torch.randn(n, t, generator=g)
    adv = torch.randn(n, 1, generator=g).expand(n, t).contiguous()
    entropy = torch.rand(n, t, generator=g)
    count = float(mask.sum())

    def agg(loss: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return (loss * m).sum() / count

    for comp in rlzoo.get_plugin_manager().registry("policy_loss"):
        try:
            fn, params = comp.load(), comp.default_params()
            inp = PolicyLossInputs(log_probs, old, adv, mask, agg, entropy=entropy)
            vec_ms, _ = timed(lambda fn=fn, params=params, inp=inp: fn(inp, params), 2)
        except Exception as exc:  # a loss with extra needs: report, do not stop the benchmark
            print(f"  policy_loss/{comp.name}: skipped ({type(exc).__name__}: {exc})")
            continue
        rows.append((f"policy_loss/{comp.name}", n, t, vec_ms, float("nan"), float("nan"), ""))
        print(f"  policy_loss/{comp.name:28s} N={n:>6d}  {vec_ms:9.1f} ms", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096,65536", help="comma-separated numbers of responses")
    ap.add_argument("--tokens", type=int, default=1024, help="response length T")
    ap.add_argument("--group-size", type=int, default=8, help="responses per prompt")
    ap.add_argument("--quick", action="store_true", help="small sizes (256,1024 x 128 tokens)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    t = args.tokens
    if args.quick:
        sizes, t = [256, 1024], 128
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, T={t}, group size {args.group_size}"
    )
    rows: list[tuple] = []
    bench_advantages(sizes, t, args.group_size, rows)
    # the same group-relative estimators with T = 1: the per-group work alone, without the
    # [N, T] reduction / broadcast (memory-bound, identical in both implementations)
    bench_advantages(sizes, 1, args.group_size, rows, only=GROUP_RELATIVE)
    bench_policy_losses(min(sizes), t, rows)
    print()
    head = ("part", "N", "T", "vectorised ms", "loop ms", "speed-up", "loop")
    print(
        f"| {head[0]:40s} | {head[1]:>6s} | {head[2]:>5s} | {head[3]:>13s} | {head[4]:>9s} | {head[5]:>8s} | loop |"
    )
    print(f"|{'-' * 42}|{'-' * 8}|{'-' * 7}|{'-' * 15}|{'-' * 11}|{'-' * 10}|------|")
    for part, n, t_, vec, loop, speed, kind in rows:
        loop_s = "-" if loop != loop else f"{loop:9.1f}"
        speed_s = "-" if speed != speed else f"{speed:7.1f}x"
        print(f"| {part:40s} | {n:>6d} | {t_:>5d} | {vec:13.1f} | {loop_s:>9s} | {speed_s:>8s} | {kind} |")


if __name__ == "__main__":
    main()
