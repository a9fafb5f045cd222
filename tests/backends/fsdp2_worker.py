"""torchrun worker for tests/backends/test_fsdp2.py: one launch runs every distributed scenario.

    torchrun --nproc_per_node=2 tests/backends/fsdp2_worker.py OUT_DIR

Each rank runs the same SPMD program; rank 0 writes the results to ``OUT_DIR/results.safetensors``
(tensors) and ``OUT_DIR/results.json`` (numbers), which the test compares with the native backend
run in one process. Also importable: the tiny model, batches and objectives the test shares.
"""

from __future__ import annotations

import json
import logging
import random
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import AggContext
from rlzoo.kernel.settings import MicroBatchSettings, OptimSettings
from rlzoo.models.tiny import tiny_qwen2_config
from rlzoo.testing.backends import make_train_batch

V = 64


def tiny_model(seed: int = 0, tie: bool = True) -> torch.nn.Module:
    """Qwen2, hidden 32, 2 layers (~20k params + embeddings), fp32, sdpa attention."""
    torch.manual_seed(seed)
    cfg = tiny_qwen2_config(V, tie_word_embeddings=tie, attn_implementation="sdpa")
    return AutoModelForCausalLM.from_config(cfg).float()


def sample_batch(seed: int = 0, B: int = 7) -> Batch:
    """B samples with different prompt / response lengths (odd B: uneven shards)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, V) for _ in range(rng.randint(1, 9))] for _ in range(B)]
    responses = [[rng.randrange(1, V) for _ in range(rng.randint(1, 11))] for _ in range(B)]
    return make_train_batch(prompts, responses, seed=seed)


class TokenMeanPG:
    """Hand-written objective: ``-sum(A * exp(logp - old) * mask) / global_tokens`` (token-mean).

    Bound to the whole mini-batch's token count, as :mod:`rlzoo.train.objective` objectives are.
    """

    needs_entropy = False

    def __init__(self, mini_batch: Batch, nan: bool = False) -> None:
        self.ctx = AggContext(global_tokens=float(mini_batch["response_mask"].sum()), global_sequences=1.0)
        self.nan = nan

    def __call__(self, mb: Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None) -> tuple[Any, dict]:
        mask = mb["response_mask"]  # [b, T]
        ratio = torch.exp(log_probs - mb["old_log_probs"])  # [b, T]
        loss = -(mb["advantages"] * ratio * mask).sum() / self.ctx.global_tokens
        if self.nan:
            loss = loss * float("nan")
        return loss, {"ratio_mean": (ratio * mask).sum() / mask.sum().clamp(min=1)}


class TokenMeanValue:
    """Hand-written critic objective: ``0.5 * sum((v - returns)^2 * mask) / global_tokens``."""

    needs_entropy = False

    def __init__(self, mini_batch: Batch) -> None:
        self.n = float(mini_batch["response_mask"].sum())

    def __call__(self, mb: Batch, values: torch.Tensor, _: torch.Tensor | None) -> tuple[Any, dict]:
        mask = mb["response_mask"]  # [b, T]
        return 0.5 * (((values - mb["returns"]) ** 2) * mask).sum() / self.n, {}


PARAMS: dict[str, Any] = {"device": "cpu"}
#: the trainer settings every test backend shares (rlzoo.kernel.settings.TrainSpec.optim / .micro_batch)
SETTINGS: dict[str, Any] = {
    "optim": OptimSettings(lr=1e-3, grad_clip=1.0, critic_lr=1e-3),
    "micro_batch": MicroBatchSettings(size=2, log_prob_size=2),
}


# ---------------------------------------------------------------------------------------------
# the distributed program
# ---------------------------------------------------------------------------------------------
def _main(out: Path) -> None:
    import torch.distributed as dist

    from rlzoo.backends.fsdp2 import FSDP2Params
    from rlzoo.backends.fsdp2.collectives import ensure_process_group
    from rlzoo.backends.fsdp2.train import FSDP2TrainBackend
    from rlzoo.kernel.settings import TrainSpec

    logging.basicConfig(level=logging.WARNING)
    ensure_process_group("cpu")
    rank = dist.get_rank()
    tensors: dict[str, torch.Tensor] = {}
    numbers: dict[str, Any] = {"world": dist.get_world_size()}
    b1, b2 = sample_batch(1), sample_batch(2)
    spec = TrainSpec(model_path="", need_reference=True, need_critic=True, total_steps=10, **SETTINGS)

    def weights(backend: FSDP2TrainBackend) -> dict[str, torch.Tensor]:
        return {n: t.clone() for n, t in backend.export_weights()}  # every rank iterates; rank 0 gets them

    def save(prefix: str, named: dict[str, torch.Tensor]) -> None:
        for n, t in named.items():
            tensors[f"{prefix}/{n}"] = t.contiguous()

    # 1. log-probs packed vs padded; one update each (invariance with native is checked by the test)
    for packed in (True, False):
        tag = "packed" if packed else "padded"
        be = FSDP2TrainBackend(FSDP2Params(**PARAMS, use_remove_padding=packed), spec, model=tiny_model(0))
        lp, ent = be.compute_log_probs(b1, with_entropy=True)
        tensors[f"{tag}/lp"], tensors[f"{tag}/ent"] = lp, ent  # type: ignore[assignment]
        m = be.update_policy(b1, TokenMeanPG(b1))
        numbers[f"{tag}/metrics"] = m
        save(f"{tag}/w1", weights(be))
        tensors[f"{tag}/ref_lp"] = be.compute_log_probs(b1, model="ref")[0]
        tensors[f"{tag}/values0"] = be.compute_values(b1)
        numbers[f"{tag}/critic_metrics"] = be.update_critic(b1, TokenMeanValue(b1))
        tensors[f"{tag}/values1"] = be.compute_values(b1)
        if packed:
            # 2. checkpoint after step 1, then step 2 uninterrupted
            be.save_checkpoint(out / "ckpt", {"step": 1, "note": "x"})
            numbers["packed/metrics2"] = be.update_policy(b2, TokenMeanPG(b2))
            save("uninterrupted/w2", weights(be))
            tensors["uninterrupted/values2"] = (
                be.update_critic(b2, TokenMeanValue(b2)),
                be.compute_values(b2),
            )[1]
            # 3. export_hf of the 2-step actor
            be.export_hf(out / "hf")
            tensors["packed/lp2"] = be.compute_log_probs(b2)[0]
            # 4. a non-finite loss on one rank only: every rank skips
            v = be.version
            before = weights(be)
            obj = TokenMeanPG(b1, nan=rank == 1)
            nm = be.update_policy(b1, obj)
            after = weights(be)
            numbers["nan"] = {
                "skipped": nm["actor/skipped_steps"],
                "version_same": be.version == v,
                "weights_same": all(torch.equal(before[k], after[k]) for k in before),
            }
        be.shutdown()

    # 5. resume from the checkpoint in a fresh backend (different init!), take step 2
    be = FSDP2TrainBackend(FSDP2Params(**PARAMS), spec, model=tiny_model(123))
    extra = be.load_checkpoint(out / "ckpt")
    numbers["resume/extra"] = extra
    numbers["resume/version"] = be.version
    numbers["resume/metrics2"] = be.update_policy(b2, TokenMeanPG(b2))
    save("resumed/w2", weights(be))
    be.update_critic(b2, TokenMeanValue(b2))
    tensors["resumed/values2"] = be.compute_values(b2)
    be.shutdown()

    if rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "results.safetensors"))
        (out / "results.json").write_text(json.dumps(numbers, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _main(Path(sys.argv[1]))
