"""torchrun worker for tests/backends/test_fsdp2_lora.py: the fsdp2 backend with trainer.lora.

    torchrun --nproc_per_node=2 tests/backends/fsdp2_lora_worker.py OUT_DIR

Rank 0 writes ``OUT_DIR/results.safetensors`` / ``results.json``; the test compares them with the
native backend with the same LoRA settings in one process.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from fsdp2_worker import PARAMS, SETTINGS, TokenMeanPG, TokenMeanValue, sample_batch, tiny_model

from rlzoo.kernel.settings import LoraSettings

LORA = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "up_proj"))


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
    numbers: dict[str, Any] = {}
    b1, b2 = sample_batch(1), sample_batch(2)
    spec = TrainSpec(
        model_path="", need_reference=True, need_critic=True, total_steps=10, lora=LORA, **SETTINGS
    )

    def save(prefix: str, backend: FSDP2TrainBackend) -> None:
        for n, t in backend.export_weights():  # every rank iterates; rank 0 gets them
            tensors[f"{prefix}/{n}"] = t.clone().contiguous()

    be = FSDP2TrainBackend(FSDP2Params(**PARAMS), spec, model=tiny_model(0))
    numbers["trainable"] = sorted(n for n, p in be.actor.named_parameters() if p.requires_grad)
    numbers["ref_params"] = len(list(be.ref.parameters()))
    numbers["m1"] = be.update_policy(b1, TokenMeanPG(b1))
    be.update_critic(b1, TokenMeanValue(b1))
    save("w1", be)
    tensors["lp1"] = be.compute_log_probs(b1)[0]
    tensors["ref_lp1"] = be.compute_log_probs(b1, model="ref")[0]
    be.save_checkpoint(out / "ckpt", {"step": 1})
    numbers["m2"] = be.update_policy(b2, TokenMeanPG(b2))
    save("uninterrupted/w2", be)
    be.export_hf(out / "hf")
    tensors["lp2"] = be.compute_log_probs(b2)[0]
    be.shutdown()

    # resume: the base weights come from the model again, the adapter and its AdamW state from the checkpoint
    be = FSDP2TrainBackend(FSDP2Params(**PARAMS), spec, model=tiny_model(0))
    numbers["resume/extra"] = be.load_checkpoint(out / "ckpt")
    numbers["resume/m2"] = be.update_policy(b2, TokenMeanPG(b2))
    save("resumed/w2", be)
    be.shutdown()

    if rank == 0:
        from safetensors.torch import save_file

        save_file(tensors, str(out / "results.safetensors"))
        (out / "results.json").write_text(json.dumps(numbers, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _main(Path(sys.argv[1]))
