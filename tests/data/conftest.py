"""Fixtures of the data tests: a tiny offline tokenizer, PNG bytes, upstream-layout files."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

#: Renders ``<|user|> hello world <|assistant|>``: one token per whitespace-separated word, so
#: a prompt of W words is W + 2 tokens (``<|user|>`` and ``<|assistant|>``).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["[UNK]", "[PAD]", "<eos>", "<|user|>", "<|system|>", "<|assistant|>"]
CORPUS = [
    "what is one plus one",
    "solve for x in two plus x equals five",
    "find x <image> round to the nearest tenth",
]


def make_tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> Any:
    """A word-level PreTrainedTokenizerFast trained offline on a few strings."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=SPECIAL))
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="<eos>"
    )
    if chat_template is not None:
        out.chat_template = chat_template
    return out


@pytest.fixture
def tokenizer() -> Any:
    return make_tokenizer()


@pytest.fixture(autouse=True)
def _isolated_hf_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep datasets' cache out of the home directory and never reach the hub."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def png_bytes(color: tuple[int, int, int] = (255, 0, 0), size: tuple[int, int] = (4, 3)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows to a parquet file with pyarrow (types inferred)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def chat_row(content: str, ground_truth: Any = "2", **extra: Any) -> dict[str, Any]:
    """One row in rlzoo's (verl's) schema."""
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": "train", "index": 0},
    }
    row.update(extra)
    return row
