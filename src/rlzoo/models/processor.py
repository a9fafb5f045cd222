"""Vision-language processors: tell a VL model folder, load its processor, expand a prompt's images.

Data-side and model-agnostic, so the core (datasets, request building) and every backend use the
same functions; the native backend's M-RoPE and pixel plumbing is in
:mod:`rlzoo.backends.native.multimodal`. Nothing here is imported unless a VL model is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

__all__ = ["expand_prompt", "has_vision_config", "image_only_processor_class", "load_processor"]


def has_vision_config(path: str, trust_remote_code: bool = False) -> bool:
    """Whether the model folder / hub name ``path`` is a vision-language model (its config has a
    ``vision_config``): load it with ``AutoModelForImageTextToText`` and ``AutoProcessor``."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    return getattr(cfg, "vision_config", None) is not None


def load_processor(path: str, trust_remote_code: bool = False) -> Any:
    """``AutoProcessor.from_pretrained(path)``; without torchvision, an image-only processor.

    transformers builds Qwen2-VL-style processors with a video processor that needs torchvision.
    When that import fails, the processor is built from the folder's image processor and tokenizer
    through :func:`image_only_processor_class` (identical for image prompts; videos unsupported).
    """
    from transformers import AutoConfig, AutoImageProcessor, AutoProcessor

    try:
        return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ImportError as exc:  # e.g. "Qwen2VLVideoProcessor requires the Torchvision library"
        from transformers.models.auto.processing_auto import (
            PROCESSOR_MAPPING_NAMES,
            processor_class_from_name,
        )

        model_type = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code).model_type
        name = PROCESSOR_MAPPING_NAMES.get(model_type)
        base = processor_class_from_name(name) if name else None
        if base is None:
            raise
        import logging

        logging.getLogger(__name__).warning(
            "AutoProcessor(%s) failed (%s); using an image-only %s (no video inputs)",
            path,
            str(exc).strip().splitlines()[0],
            name,
        )
        from rlzoo.data.tokenizer import load_tokenizer

        tok = load_tokenizer(path, trust_remote_code=trust_remote_code)
        image_processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
        return image_only_processor_class(base)(
            image_processor, tok, chat_template=getattr(tok, "chat_template", None)
        )


def image_only_processor_class(base: type) -> type:
    """``base`` (a Qwen2-VL-style processor class) without its video processor.

    transformers 5 builds a processor's sub-processors from its ``__init__`` arguments and checks
    each one's class; the video processor class needs torchvision, which a CPU environment may lack.
    Images are all the recipes use, so this subclass takes only an image processor and a
    tokenizer; everything else (placeholder expansion, chat template) is ``base``'s.
    """
    from transformers.processing_utils import ProcessorMixin

    class ImageOnlyProcessor(base):  # type: ignore[misc, valid-type]
        def __init__(
            self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kw: Any
        ):
            self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
            self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            self.video_processor = None
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    ImageOnlyProcessor.__name__ = ImageOnlyProcessor.__qualname__ = f"ImageOnly{base.__name__}"
    return ImageOnlyProcessor


def expand_prompt(
    processor: Any, prompt_text: str, images: Sequence[Any]
) -> tuple[list[int], dict[str, Tensor]]:
    """Token ids of a rendered VL prompt with its image tokens expanded, and its pixel inputs.

    ``prompt_text`` is the chat-template rendering (what :class:`rlzoo.data.dataset.PromptDataset`
    stores as ``prompt_text`` when built with a ``processor``); ``images`` are PIL images in
    placeholder order. Returns ``(prompt_ids, {"pixel_values": [N, D], "image_grid_thw": [I, 3]})``.
    """
    out = processor(text=[prompt_text], images=list(images) or None, return_tensors="pt")
    ids = out["input_ids"][0].tolist()
    mm: dict[str, Tensor] = {}
    if images:
        mm["pixel_values"] = out["pixel_values"]
        mm["image_grid_thw"] = out["image_grid_thw"]
    return ids, mm
