"""LoRA pushes on the vLLM rollout backend (``trainer.lora``), through vLLM's own LoRA adapter loading.

A LoRA run's trainer pushes only the adapter tensors (model-relative names such as
``model.layers.0.self_attn.q_proj.lora_A.default.weight``, see :mod:`rlzoo.train_kit.lora`). vLLM serves a
LoRA adapter from a PEFT folder named by a ``LoRARequest(lora_name, lora_int_id, lora_path)``:
the engine is built with ``enable_lora`` (:func:`lora_engine_args`), each push is written as a
fresh PEFT folder with a new ``lora_int_id`` (:class:`AdapterPushes`), and every engine request
started after the push carries that ``LoRARequest`` (vLLM loads it on first use, into the slot of
the previous one, ``max_loras=1``). The base weights in vLLM never change.

Engine-side logic only (folders, ids, engine arguments) is tested on CPU
(``tests/backends/test_vllm_lora.py``, real peft); like the rest of this backend it has not been
run against a real vLLM engine yet (docs/lora.md says so).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.settings import LoraSettings

__all__ = ["VLLM_MAX_LORA_RANKS", "AdapterPushes", "lora_engine_args", "max_lora_rank"]

#: the values vLLM accepts for ``max_lora_rank`` (``vllm.config.lora.MaxLoRARanks``)
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of rank ``rank``."""
    for r in VLLM_MAX_LORA_RANKS:
        if r >= rank:
            return r
    raise RlzooError(
        f"trainer.lora.rank={rank}: vLLM serves LoRA adapters up to rank {VLLM_MAX_LORA_RANKS[-1]}; "
        "use a smaller rank or the native rollout backend"
    )


def lora_engine_args(settings: LoraSettings) -> dict[str, Any]:
    """``AsyncEngineArgs`` keywords that let the engine serve the run's adapter (one at a time)."""
    return {"enable_lora": True, "max_lora_rank": max_lora_rank(settings.rank), "max_loras": 1}


#: vLLM's ``lora_int_id`` of the adapter a run continues from (pushes count 1, 2, ...: never this)
START_ADAPTER_ID = 2**30


class AdapterPushes:
    """Each adapter push as a PEFT folder under ``root`` and the ``LoRARequest`` that names it.

    ``write`` makes ``root/push_{n}`` (``n`` counts pushes from 1: vLLM's ``lora_int_id`` must be
    positive and new for new weights) and removes the folders of pushes older than the one before
    it (requests started under the previous push may still be loading it). Before the first push
    :meth:`request_kwargs` is None: the trainer's initial adapter has ``B = 0``, the base model.
    """

    def __init__(self, settings: LoraSettings, base_model: str, root: str | Path | None = None) -> None:
        self.settings = settings
        self.base_model = base_model
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="rlzoo-vllm-lora-")) if root is None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.pushes = 0
        self.version: int | None = None

    def folder(self, n: int) -> Path:
        return self.root / f"push_{n}"

    def write(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> Path:
        """Write one push (the adapter tensors of ``rlzoo.train_kit.lora.adapter_items``) as a PEFT folder."""
        from rlzoo.train_kit.lora import is_adapter_name, save_adapter

        items = list(named_tensors)
        stray = [n for n, _ in items if not is_adapter_name(n)]
        if stray:
            raise RlzooError(
                f"vllm LoRA push: {len(stray)} tensors are not LoRA adapter tensors, e.g. {stray[:3]} "
                "(a LoRA run pushes the adapter only; is trainer.lora set on the trainer too?)"
            )
        n = self.pushes + 1
        out = save_adapter(items, self.settings, self.folder(n), base_model=self.base_model)
        self.pushes, self.version = n, int(version)
        for old in range(1, n - 1):
            shutil.rmtree(self.folder(old), ignore_errors=True)
        return out

    def request_kwargs(self) -> dict[str, Any] | None:
        """``LoRARequest`` keywords of the newest push; before the first one, the adapter the run
        continues from (``trainer.lora.adapter_path``), else None (fresh adapters: the base model)."""
        if self.pushes == 0:
            start = self.settings.adapter_path
            if start is None:
                return None
            return {
                "lora_name": "rlzoo-start-adapter",
                "lora_int_id": START_ADAPTER_ID,
                "lora_path": str(Path(start).expanduser()),
            }
        return {
            "lora_name": f"rlzoo-push-{self.pushes}-v{self.version}",
            "lora_int_id": self.pushes,
            "lora_path": str(self.folder(self.pushes)),
        }

    def request(self) -> Any:
        """The ``vllm.lora.request.LoRARequest`` of the newest push (None before the first)."""
        kw = self.request_kwargs()
        if kw is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(**kw)

    def close(self) -> None:
        """Remove the folders this object made (``root`` too when it created it)."""
        for n in range(1, self.pushes + 1):
            shutil.rmtree(self.folder(n), ignore_errors=True)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
