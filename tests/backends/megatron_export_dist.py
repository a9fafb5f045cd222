"""``export_hf`` of the megatron backend in a 2-process gloo world (run under torchrun).

    torchrun --standalone --nproc_per_node=2 tests/backends/megatron_export_dist.py tp2|pp2 SHARED_DIR

Not collected (no ``test_`` prefix): ``tests/backends/test_megatron_export.py`` launches it. Every
rank builds the backend (TP=2 or PP=2 on CPU), takes one update step and exports (collective); rank
0 then loads the folder with plain transformers and writes the largest difference between its
log-probs and the backend's to ``SHARED_DIR/result.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

LAYOUTS = {"tp2": {"tensor_model_parallel_size": 2}, "pp2": {"pipeline_model_parallel_size": 2}}


def main(layout: str, shared: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rlzoo.backends.megatron import MegatronParams
    from rlzoo.backends.megatron.train import MegatronTrainBackend
    from rlzoo.kernel.settings import OptimSettings, TrainSpec
    from rlzoo.testing.backends import (
        TokenMeanObjective,
        _random_batch,
        reference_batch_log_probs,
        save_tiny_qwen2,
    )

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    src = save_tiny_qwen2(shared / f"base-rank{rank}", seed=2)  # the same weights on every rank
    spec = TrainSpec(
        model_path=str(src), total_steps=10, temperature=0.9, optim=OptimSettings(lr=1e-2, grad_clip=0.0)
    )
    params = MegatronParams(device="cpu", dtype="float32", use_distributed_optimizer=False, **LAYOUTS[layout])
    batch = _random_batch(4)
    be = MegatronTrainBackend(params, spec)
    try:
        be.update_policy(batch, TokenMeanObjective(batch))
        be.export_hf(shared / "hf")
        trainer_lp, _ = be.compute_log_probs(batch)
        temperature = be.temperature
    finally:
        be.shutdown()
    if rank != 0:
        return
    model = AutoModelForCausalLM.from_pretrained(shared / "hf", dtype=torch.float32).eval()
    diff = (reference_batch_log_probs(model, batch, temperature) - trainer_lp).abs().max().item()
    rows = int(model.get_input_embeddings().weight.shape[0])
    (shared / "result.json").write_text(json.dumps({"max_abs_diff": diff, "vocab_rows": rows}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
