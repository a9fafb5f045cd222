"""Methods rlzoo adds to every vLLM GPU worker (``worker_extension_cls``). Runs inside vLLM's workers.

vLLM mixes this class into its worker class in each worker process, so ``self`` is the worker:
``self.model_runner.model`` is the model, ``self.vllm_config`` its config. Method names carry an
``rlzoo_`` prefix (vLLM refuses an extension whose names collide with the worker's own, e.g. its
``update_weights``). Called with ``AsyncLLM.collective_rpc("rlzoo_...", args=...)``, which runs the
method on every TP worker.

Written against vLLM 0.32.0; **not yet run on a GPU**.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["RlzooWorkerExtension"]


class RlzooWorkerExtension:
    """Weight loading and the NCCL weight receive hook, per vLLM worker."""

    # set by vLLM's worker, declared for type checkers
    model_runner: Any
    vllm_config: Any

    def _rlzoo_model(self) -> Any:
        return self.model_runner.model

    def rlzoo_load_weights(self, named: Iterable[tuple[str, Any]]) -> int:
        """``model.load_weights`` of one bucket of HF-named tensors (any device); returns the count.

        The model's loader fuses q/k/v → ``qkv_proj`` and gate/up → ``gate_up_proj`` and takes this
        TP rank's slice of each full tensor.
        """
        import torch
        from vllm.config import set_current_vllm_config

        model = self._rlzoo_model()
        device = next(model.parameters()).device
        items = [(n, t.to(device, non_blocking=True)) for n, t in named]
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            model.load_weights(weights=items)
        torch.cuda.synchronize(device)
        return len(items)

    # -- NCCL receive hook (rlzoo.distributed.weight_sync protocol) -----------------------------
    def rlzoo_init_sync(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str = "nccl",
        timeout_s: float = 300.0,
    ) -> None:
        """Join an rlzoo weight-sync group as member ``rank`` (a receiver, rank > 0).

        For a placement that makes each TP worker of each replica a member of the sync group (the
        sender is trainer rank 0): then weights go straight from the trainer's GPU into this
        worker's GPU over NCCL, with no trip through the driver process or the CPU.
        """
        from rlzoo.distributed.weight_sync import TorchSyncGroup

        self._rlzoo_sync = TorchSyncGroup(host, port, rank, world_size, backend=backend, timeout_s=timeout_s)

    def rlzoo_receive_weights(self) -> dict[str, Any]:
        """Take part in one sync round: receive every bucket and load it as it arrives."""
        import torch
        from vllm.config import set_current_vllm_config

        from rlzoo.backends.vllm.logic import map_names
        from rlzoo.distributed.weight_sync import SyncStats, apply_and_drain

        group = getattr(self, "_rlzoo_sync", None)
        if group is None:
            raise RuntimeError("rlzoo_receive_weights before rlzoo_init_sync")
        stats = SyncStats()
        model = self._rlzoo_model()
        text_cfg = self.vllm_config.model_config.hf_config.get_text_config()
        tied = bool(getattr(text_cfg, "tie_word_embeddings", False))

        def apply(stream: Iterable[tuple[str, Any]]) -> None:
            with set_current_vllm_config(self.vllm_config), torch.no_grad():
                for name, t in map_names(stream, tie_word_embeddings=tied):
                    model.load_weights(weights=[(name, t)])

        apply_and_drain(apply, group.receive(stats))
        return {
            "bytes": stats.bytes,
            "tensors": stats.tensors,
            "buckets": stats.buckets,
            "seconds": stats.seconds,
        }

    def rlzoo_close_sync(self) -> None:
        group = getattr(self, "_rlzoo_sync", None)
        if group is not None:
            group.close()
            self._rlzoo_sync = None
