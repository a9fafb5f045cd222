"""GGUF checkpoint -> Hugging Face model folder (weights, config, tokenizer with its chat template).

A GGUF file (llama.cpp's format) carries the weights, possibly quantized, the architecture's
hyperparameters and the tokenizer (vocabulary, merges, special tokens, chat template). rlzoo's
trainers and engine load HF folders, so :func:`gguf_to_hf` dequantizes a GGUF file once into one::

    from rlzoo.models.gguf import gguf_to_hf
    gguf_to_hf("SmolLM2-135M-Instruct.Q4_1.gguf", "out/model", dtype="float32")

It reads the file with transformers' GGUF loader (``from_pretrained(..., gguf_file=...)``, which
needs the ``gguf`` package; transformers dequantizes every tensor and undoes llama.cpp's q/k row
permutation), then rebuilds a plain model from the parsed config and loads the dequantized state
dict into it: transformers refuses to ``save_pretrained`` a model still marked as GGUF-loaded.
The folder gets ``model.safetensors``, ``config.json``, ``generation_config.json`` (EOS from the
tokenizer) and the fast tokenizer with the GGUF's chat template.

Importing this module imports neither torch nor transformers nor gguf.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError

__all__ = ["DTYPES", "GGUFError", "gguf_to_hf", "require_gguf"]

#: dtypes the converted weights can be written in
DTYPES = ("float32", "bfloat16")
#: written next to the converted weights: what they were converted from (a cache key)
SOURCE_FILE = "rlzoo_gguf_source.json"


class GGUFError(RlzooError, ValueError):
    """A GGUF file could not be converted (missing package, unsupported architecture, bad dtype)."""


def require_gguf() -> None:
    """Raise :class:`GGUFError` naming the pip command when ``gguf`` / ``accelerate`` are missing."""
    import importlib.util

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise GGUFError(
            f"converting a GGUF file needs the {' and '.join(missing)} package(s): "
            f"pip install {' '.join(missing)}  (or: pip install 'rlzoo[gguf]')"
        )


def source_key(gguf_file: Path, dtype: str) -> dict[str, Any]:
    st = gguf_file.stat()
    return {
        "gguf_file": str(gguf_file.resolve()),
        "size": st.st_size,
        "mtime": int(st.st_mtime),
        "dtype": dtype,
    }


def is_converted(gguf_file: str | Path, out_dir: str | Path, dtype: str = "float32") -> bool:
    """True when ``out_dir`` already holds this exact file converted to ``dtype``."""
    marker = Path(out_dir) / SOURCE_FILE
    if not marker.exists() or not (Path(out_dir) / "config.json").exists():
        return False
    try:
        return bool(json.loads(marker.read_text()) == source_key(Path(gguf_file), dtype))
    except (OSError, ValueError):
        return False


def gguf_to_hf(gguf_file: str | Path, out_dir: str | Path, *, dtype: str = "float32") -> Path:
    """Dequantize ``gguf_file`` into an HF folder ``out_dir`` (weights in ``dtype``); return ``out_dir``."""
    if dtype not in DTYPES:
        raise GGUFError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    src = Path(gguf_file).expanduser()
    if not src.is_file():
        raise GGUFError(f"GGUF file not found: {src}")
    require_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    torch_dtype = getattr(torch, dtype)
    folder, name = str(src.parent), src.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except ValueError as e:  # transformers: "GGUF model with architecture X is not supported yet."
        raise GGUFError(f"cannot read {src}: {e}") from e
    config = loaded.config
    state = {k: v.detach().to(torch_dtype) for k, v in loaded.state_dict().items()}
    del loaded
    # a plain model from the parsed config (save_pretrained refuses the GGUF-loaded one): the
    # weights are dequantized, so the config must not claim a GGUF quantization any more
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise GGUFError(
            f"{src}: weights do not match the architecture: missing={missing} unexpected={unexpected}"
        )
    if tied:
        model.tie_weights()
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    gen = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    gen.save_pretrained(out)
    (out / SOURCE_FILE).write_text(json.dumps(source_key(src, dtype)))
    return out
