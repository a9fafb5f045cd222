"""Worker for ``test_megatron_moe.py``: the megatron backend on a tiny MoE split by LAYOUT against
the unsplit model, in a 2-process gloo world (``torchrun --nproc_per_node=2 megatron_moe_ep_dist.py
DIR FAMILY LAYOUT``).

The unsplit run: TP = EP = 1, data parallel over the 2 ranks (each its contiguous half of the
batch), every rank all 4 experts. LAYOUT ``ep2``: the same data parallelism, rank r holding
experts 2r, 2r+1 (tokens sent to them by the alltoall dispatcher). One ``update_policy`` step each, then the total
loss (summed over data-parallel ranks), the log-probs after the step and every parameter after the
step gathered by ``export_weights`` (HF names, all experts) are compared on each rank. Prints
``MOE BACKEND LAYOUT == unsplit`` with the largest differences on success.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from rlzoo.backends.megatron import MegatronParams
from rlzoo.backends.megatron.train import MegatronTrainBackend
from rlzoo.kernel.settings import OptimSettings, TrainSpec
from rlzoo.testing.backends import TokenMeanObjective, _random_batch

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: the tiny-MoE builder beside it
from megatron_moe_models import save_tiny_moe

#: tolerance of every comparison (fp32)
ATOL = 1e-5
LAYOUTS = {
    "unsplit": {},
    "ep2": {"expert_parallel_size": 2},
    # router replay: every token routed to the recorded experts (drawn at random, the same on each rank)
    "unsplit_replay": {"router_replay": True},
    "ep2_replay": {"expert_parallel_size": 2, "router_replay": True},
}


def with_routes(batch: object, layers: int = 2, experts: int = 4, top_k: int = 2) -> object:
    """``batch`` with ``routed_experts`` [B, S, layers, top_k]: distinct random experts, -1 on padding."""
    B, S = batch["input_ids"].shape  # type: ignore[index]
    g = torch.Generator().manual_seed(7)
    routes = torch.rand(B, S, layers, experts, generator=g).argsort(-1)[..., :top_k]
    real = batch["attention_mask"][..., None, None].bool()  # type: ignore[index]
    batch["routed_experts"] = torch.where(real, routes, -1).short()  # type: ignore[index]
    return batch


def run(model: Path, layout: str) -> dict[str, object]:
    import torch.distributed as dist

    spec = TrainSpec(
        model_path=str(model), total_steps=10, temperature=0.9, optim=OptimSettings(lr=1e-2, grad_clip=0.0)
    )
    params = MegatronParams(device="cpu", dtype="float32", use_distributed_optimizer=False, **LAYOUTS[layout])
    b = MegatronTrainBackend(params, spec)
    try:
        lay = b.layout
        assert lay.ep == params.expert_parallel_size and lay.tp * lay.dp == 2, lay
        local = sum(1 for n, _ in b.actor.named_parameters() if ".local_experts." in n and "fc1" in n)
        assert local == 2 * 4 // lay.ep, f"{layout}: {local} expert fc1 weights on this rank"  # 2 layers
        batch = _random_batch(3, B=6)
        if params.router_replay:
            batch = with_routes(batch)
        metrics = b.update_policy(batch, TokenMeanObjective(batch))
        assert not metrics["actor/skipped_steps"], metrics
        loss = torch.tensor([metrics["actor/loss"]])
        dist.all_reduce(loss)  # each DP rank's share once, counted by each of its TP ranks
        lp, _ = b.compute_log_probs(batch)
        weights = {k: v.detach().clone() for k, v in b.export_weights()}
    finally:
        b.shutdown()
    return {"loss": float(loss) / lay.tp, "lp": lp, "weights": weights}


def main() -> None:
    out, family, layout = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    model = save_tiny_moe(out / f"rank{os.environ['RANK']}", family)  # the same weights on each rank
    base = "unsplit_replay" if layout.endswith("_replay") else "unsplit"
    one, two = run(model, base), run(model, layout)
    from safetensors.torch import load_file

    w1, w2 = one["weights"], two["weights"]
    assert isinstance(w1, dict) and isinstance(w2, dict) and sorted(w1) == sorted(w2)
    assert any(".experts." in k for k in w1), sorted(w1)
    diffs = {
        "loss": abs(float(one["loss"]) - float(two["loss"])),  # type: ignore[arg-type]
        "log_probs": float((one["lp"] - two["lp"]).abs().max()),  # type: ignore[operator]
        "params": max(float((w1[k] - w2[k]).abs().max()) for k in w1),
    }
    fused = "model.layers.0.mlp.experts.gate_up_proj"
    before = load_file(str(model / "model.safetensors"))
    e3 = torch.cat(
        [
            before["model.layers.0.mlp.experts.3.gate_proj.weight"],
            before["model.layers.0.mlp.experts.3.up_proj.weight"],
        ]
    )
    moved = float((w2[fused][3] - e3).abs().max())  # expert 3 lives on EP rank 1 only
    assert moved > 1e-3, f"the step did not move expert 3 ({moved})"
    assert all(d < ATOL for d in diffs.values()), diffs
    print(
        f"MOE BACKEND {layout} == {base} ({family}) rank {os.environ['RANK']}: max|diff| {diffs}, expert 3 moved {moved:.3g}"
    )


if __name__ == "__main__":
    main()
