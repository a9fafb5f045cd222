"""Tiny models, tokenizers and upstream-layout datasets for the recipes' tiny-scale variants.

Every shipped recipe (``recipes/<name>.yaml``) has a tiny override set (``src/rlzoo/recipes/tiny/<name>.yaml``)
that swaps the 7B model for a ~50k-parameter Qwen2 built from a config, the hub datasets for a few
rows written in the *upstream* layout (run through the real preparer), and the GPU backends for
the native ones, so the whole recipe runs on a laptop CPU in seconds::

    python -m rlzoo.models.tiny dapo_math          # writes $RLZOO_TINY_DIR/dapo_math/{model,upstream}
    rlzoo train dapo_math +tiny=dapo_math

:func:`build_tiny` writes, under ``<root>/<recipe>/``:

- ``model/``: a tiny Qwen2 causal LM (random weights, seed fixed) with a word-level tokenizer that
  has a chat template, and a ``generation_config.json`` naming its EOS; for the vision-language
  recipe (``grpo_geo3k_vl``) a tiny Qwen2.5-VL (:func:`build_tiny_qwen2_5_vl`) with the same
  tokenizer plus Qwen's vision tokens, and its image processor;
- ``upstream/``: the recipe's datasets in the layout the hub publishes them in (GSM8K's
  ``main/{train,test}-*.parquet`` + README configs, DAPO-Math-17k's verl layout with repeated
  prompts, AIME-2024's single ``train`` split, Geometry3K's ``data/{split}-*.parquet`` with PNG
  images). The recipe's ``data.prepare`` turns them into rlzoo's schema on first use, exactly as
  it does with the real downloads; only AIME-2024 (DAPO's second dataset, which ``data.prepare``
  cannot name) is prepared here, with the real ``aime2024`` preparer.

The tokenizer's vocabulary is deliberately small (special tokens, digits and the answer markers
``Answer:``, ``####``, ``\\boxed{N}``): most prompt words become ``[UNK]``, but a random model
ends responses early often enough (EOS is one token in ~30) for group rewards to vary, which DAPO's
dynamic sampling needs, and it can emit every answer format the scorers look for.

:func:`build_tiny_qwen2_5_vl` builds a tiny Qwen2.5-VL model + processor offline (see
:mod:`rlzoo.backends.native.multimodal`). :func:`build_tiny_llama` builds the tasks' tiny model
(``quickstart``): a Llama, whose word-level tokenizer plain ``AutoTokenizer`` keeps.

Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "TINY_DATASETS",
    "TINY_MODELS",
    "build_tiny",
    "build_tiny_llama",
    "build_tiny_qwen2",
    "build_tiny_qwen2_5_vl",
    "build_tokenizer",
    "default_root",
    "png_bytes",
    "write_aime2024_source",
    "write_dapo_math_source",
    "write_geometry3k_source",
    "write_gsm8k_source",
]

#: Renders ``<|user|> text <|assistant|>`` (system messages included as ``<|system|> text``).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ("<pad>", "<eos>", "[UNK]", "<|system|>", "<|user|>", "<|assistant|>")
#: the words a tiny model can say: digits, the answer markers of every scorer, a few fillers
WORDS = (
    *(str(d) for d in range(10)),
    "Answer:",
    "####",
    *(f"\\boxed{{{d}}}" for d in range(10)),
    "<think>",
    "</think>",
    "the",
    "is",
    "x",
)
#: the upstream-layout datasets :func:`build_tiny` can write, and the tiny models it can build
TINY_DATASETS = ("gsm8k", "dapo_math", "aime2024", "geometry3k")
TINY_MODELS = ("qwen2", "qwen2_5_vl")
ENV_TINY_DIR = "RLZOO_TINY_DIR"


def default_root() -> Path:
    """``$RLZOO_TINY_DIR``, else ``~/.cache/rlzoo/tiny`` (what the tiny override sets read)."""
    return Path(os.environ.get(ENV_TINY_DIR) or "~/.cache/rlzoo/tiny").expanduser()


# ---------------------------------------------------------------------------------------------
# tokenizer and model
# ---------------------------------------------------------------------------------------------
def build_tokenizer(
    words: Sequence[str] = WORDS,
    chat_template: str | None = CHAT_TEMPLATE,
    *,
    extra_special: Sequence[str] = (),
) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` (whitespace split) with a chat template.

    ``extra_special``: more special tokens (never split, e.g. Qwen's vision tokens).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(dict.fromkeys([*SPECIAL_TOKENS, *extra_special, *words]))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="[UNK]",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>", *extra_special],
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def _tiny_shape(vocab_size: int, hidden_size: int, num_layers: int) -> dict[str, Any]:
    """The tiny models' shape: 4 heads, 2 KV heads (GQA), FFN 2x hidden."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }


def tiny_qwen2_config(
    vocab_size: int, *, hidden_size: int = 32, num_layers: int = 2, **overrides: Any
) -> Any:
    """A tiny ``Qwen2Config``: 4 heads, 2 KV heads (GQA), FFN 2x hidden; ``overrides`` go to the config."""
    from transformers import Qwen2Config

    return Qwen2Config(**{**_tiny_shape(vocab_size, hidden_size, num_layers), **overrides})


def tiny_llama_config(
    vocab_size: int, *, hidden_size: int = 32, num_layers: int = 2, **overrides: Any
) -> Any:
    """A tiny ``LlamaConfig`` shaped like :func:`tiny_qwen2_config` (4 heads, 2 KV heads, FFN 2x
    hidden; no attention biases, the one difference from a Qwen2)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        **{**_tiny_shape(vocab_size, hidden_size, num_layers), "attention_bias": False, **overrides}
    )


def build_tiny_model(
    make_config: Any,
    out_dir: Path | None = None,
    *,
    tokenizer: Any = None,
    hidden_size: int = 32,
    num_layers: int = 2,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> tuple[Any, Any]:
    """A tiny random causal LM of ``make_config``'s architecture (and its tokenizer); saved to
    ``out_dir`` when given, as a normal HF model folder (``config.json``, safetensors, tokenizer
    files with the chat template, ``generation_config.json``) that ``from_pretrained`` and the native
    backends load. :func:`build_tiny_qwen2` and :func:`build_tiny_llama` fix ``make_config``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    tok = tokenizer if tokenizer is not None else build_tokenizer()
    cfg = make_config(
        len(tok),
        hidden_size=hidden_size,
        num_layers=num_layers,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        model.generation_config.save_pretrained(out)
    return model, tok


build_tiny_qwen2 = functools.partial(build_tiny_model, tiny_qwen2_config)
build_tiny_qwen2.__doc__ = "A tiny random Qwen2 causal LM (and its tokenizer): :func:`build_tiny_model`."

build_tiny_llama = functools.partial(build_tiny_model, tiny_llama_config)
build_tiny_llama.__doc__ = """A tiny random Llama causal LM (and its tokenizer): :func:`build_tiny_model`.

The quickstart task's model (its tokenizer is a word-level one of its own):
transformers 5's ``AutoTokenizer`` loads a Qwen2 folder's tokenizer as ``Qwen2Tokenizer``
whatever ``tokenizer_config.json`` declares (``qwen2`` is in its
``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``), and that byte-level tokenizer loses the words
of a word-level vocabulary; next to a Llama config the declared ``TokenizersBackend`` is kept,
so the run's exported ``final/`` loads right with plain ``AutoTokenizer``.
"""


def build_tiny_qwen2_5_vl(out_dir: Path | None = None, *, seed: int = 0) -> tuple[Any, Any]:
    """A tiny random Qwen2.5-VL model and a matching ``Qwen2_5_VLProcessor``, offline.

    Text: 2 layers of width 32 (``mrope_section`` [2, 2, 4] over a head dim of 16); vision: 2 blocks
    of width 32, patch 14, 2x2 spatial merge, so a 56x56 image is 4x4 patches -> 4 image tokens.
    The tokenizer is :func:`build_tokenizer` plus Qwen's vision tokens (``<|vision_start|>``,
    ``<|image_pad|>``, ``<|vision_end|>``, ``<|video_pad|>``); the chat template renders
    ``{"type": "image"}`` content parts as ``<|vision_start|><|image_pad|><|vision_end|>``, which the
    processor expands to one ``<|image_pad|>`` per merged patch.
    """
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    try:
        from transformers import Qwen2VLImageProcessorPil as ImageProcessor
    except ImportError:  # older transformers
        from transformers import Qwen2VLImageProcessor as ImageProcessor  # type: ignore[assignment]

    vision_tokens = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok = build_tokenizer(chat_template=VL_CHAT_TEMPLATE, extra_special=vision_tokens)
    ids = {t: tok.convert_tokens_to_ids(t) for t in vision_tokens}
    image_processor = ImageProcessor(
        min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, temporal_patch_size=2, merge_size=2
    )
    processor = _image_only_processor(Qwen2_5_VLProcessor)(
        image_processor, tok, chat_template=VL_CHAT_TEMPLATE
    )
    text_cfg = {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 512,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]},
        "tie_word_embeddings": True,
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
        "bos_token_id": None,
    }
    vision_cfg = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 32,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 56,
        "fullatt_block_indexes": [1],
        "in_channels": 3,
    }
    cfg = Qwen2_5_VLConfig(
        text_config=text_cfg,
        vision_config=vision_cfg,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    if out_dir is not None:  # loadable with from_pretrained / AutoTokenizer / Qwen2VLImageProcessorPil
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        image_processor.save_pretrained(out)
        model.generation_config.save_pretrained(out)
    return model, processor


def _image_only_processor(base: type) -> type:
    """``base`` without its video processor (see :func:`rlzoo.models.processor.image_only_processor_class`)."""
    from rlzoo.models.processor import image_only_processor_class

    return image_only_processor_class(base)


#: :data:`CHAT_TEMPLATE` that also renders ``{"type": "image"}`` / ``{"type": "text"}`` content parts
VL_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> "
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


# ---------------------------------------------------------------------------------------------
# upstream-layout datasets
# ---------------------------------------------------------------------------------------------
def png_bytes(color: tuple[int, int, int] = (255, 0, 0), size: tuple[int, int] = (56, 56)) -> bytes:
    """A PNG of one colour (a stand-in geometry diagram)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _problems(n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(0, 4), rng.randint(0, 5)) for _ in range(n)]


def gsm8k_readme(configs: tuple[str, ...] = ("main",)) -> str:
    """The dataset card header of ``openai/gsm8k``: each config's train / test parquet files."""
    lines = ["---", "configs:"]
    for c in configs:
        lines += [f"- config_name: {c}", "  data_files:"]
        lines += [f"  - split: {split}\n    path: {c}/{split}-*" for split in ("train", "test")]
    return "\n".join([*lines, "---", ""])


def write_gsm8k_source(root: Path, *, n_train: int = 16, n_test: int = 4, seed: int = 0) -> Path:
    """``openai/gsm8k`` as downloaded: README configs + ``main/{train,test}-00000-of-00001.parquet``.

    Columns ``question`` and ``answer`` (a worked solution ending in ``#### <number>``).
    """
    from datasets import Dataset

    root = Path(root)
    for split, n, s in (("train", n_train, seed), ("test", n_test, seed + 1)):
        rows = _problems(n, s)
        ds = Dataset.from_dict(
            {
                "question": [
                    f"Tom has {a} apples and buys {b} more. How many apples does he have?" for a, b in rows
                ],
                "answer": [f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}" for a, b in rows],
            }
        )
        (root / "main").mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(root / "main" / f"{split}-00000-of-00001.parquet"))
    (root / "README.md").write_text(gsm8k_readme())
    return root


def dapo_math_row(problem: str, answer: str, uid: str) -> dict[str, Any]:
    """One row of BytedTsinghua-SIA/DAPO-Math-17k (and AIME-2024) as published."""
    content = (
        "Solve the following math problem step by step. The last line of your response should be "
        "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
        f'\n\n{problem}\n\nRemember to put your answer on its own line after "Answer:".'
    )
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": content, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": uid},
    }


def write_dapo_math_source(path: Path, *, n: int = 16, repeats: int = 2, seed: int = 0) -> Path:
    """``dapo-math-17k.parquet`` in verl's layout; every prompt repeated ``repeats`` times (as on the hub)."""
    from datasets import Dataset

    problems = [(f"What is {a} + {b}?", str(a + b)) for a, b in _problems(n, seed)]
    problems = list(dict(problems).items())  # distinct prompts
    rows = [dapo_math_row(p, a, f"uuid-{i}-{r}") for r in range(repeats) for i, (p, a) in enumerate(problems)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows).to_parquet(str(path))
    return path


def write_aime2024_source(path: Path, *, n: int = 4, seed: int = 7) -> Path:
    """``aime-2024.parquet`` in verl's layout (one upstream split, ``train``)."""
    from datasets import Dataset

    rows = [
        dapo_math_row(f"Find {a} + {b}.", str(a + b), f"aime-{i}")
        for i, (a, b) in enumerate(_problems(n, seed))
    ]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows).to_parquet(str(path))
    return path


def write_geometry3k_source(
    root: Path, *, n_train: int = 8, n_val: int = 2, n_test: int = 4, seed: int = 0
) -> Path:
    """``hiyouga/geometry3k`` as downloaded: ``data/{split}-00000-of-00001.parquet``.

    Columns ``images`` (one PNG diagram each), ``problem`` (``<image>`` then the text) and ``answer``.
    """
    from datasets import Dataset, Features, Image, List, Value

    feats = Features({"images": List(Image()), "problem": Value("string"), "answer": Value("string")})
    root = Path(root)
    (root / "data").mkdir(parents=True, exist_ok=True)
    for k, (split, n) in enumerate((("train", n_train), ("validation", n_val), ("test", n_test))):
        rows = _problems(n, seed + k)
        colors = [((40 * a) % 256, (50 * b) % 256, 128) for a, b in rows]
        ds = Dataset.from_dict(
            {
                "images": [[{"bytes": png_bytes(c), "path": None}] for c in colors],
                "problem": [f"<image>Find x. The two sides are {a} and {b}." for a, b in rows],
                "answer": [str(a + b) for a, b in rows],
            },
            features=feats,
        )
        ds.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    return root


# ---------------------------------------------------------------------------------------------
# one recipe's tiny inputs
# ---------------------------------------------------------------------------------------------
def tiny_inputs() -> dict[str, dict[str, Any]]:
    """Recipe -> ``{"datasets": [...], "model": ...}``: what each recipe's tiny override set needs,
    as the recipes declare it (``rlzoo/recipes/tiny/_inputs.yaml``, beside the override sets)."""
    import importlib.resources

    import yaml

    text = (importlib.resources.files("rlzoo.recipes") / "tiny" / "_inputs.yaml").read_text()
    table: dict[str, dict[str, Any]] = yaml.safe_load(text)
    for recipe, entry in table.items():
        unknown = [d for d in entry["datasets"] if d not in TINY_DATASETS]
        if unknown or entry["model"] not in TINY_MODELS:
            raise ValueError(
                f"tiny/_inputs.yaml: {recipe}: datasets must be among {TINY_DATASETS} and model one of "
                f"{TINY_MODELS}, got {entry}"
            )
    return table


def build_tiny(recipe: str, root: Path | str | None = None, *, overwrite: bool = False) -> Path:
    """Write the tiny model and upstream-layout data of ``recipe`` under ``<root>/<recipe>/``.

    ``root`` defaults to :func:`default_root` (``$RLZOO_TINY_DIR``), the folder the tiny override
    sets read. Returns ``<root>/<recipe>``. Existing files are kept unless ``overwrite``.
    """
    variants = tiny_inputs()
    if recipe not in variants:
        raise ValueError(f"no tiny variant for recipe {recipe!r}; tiny variants: {', '.join(variants)}")
    base = (Path(root).expanduser() if root is not None else default_root()) / recipe
    upstream = base / "upstream"
    done = base / ".tiny-complete"
    datasets, model_kind = list(variants[recipe]["datasets"]), str(variants[recipe]["model"])
    if done.exists() and not overwrite:
        try:
            built = json.loads(done.read_text()).get("model", "qwen2")
        except ValueError:
            built = None
        if built == model_kind:
            return base  # else: built by an older rlzoo with another tiny model; rebuild
    base.mkdir(parents=True, exist_ok=True)
    for dataset in datasets:
        if dataset == "gsm8k":
            write_gsm8k_source(upstream / "gsm8k")
        elif dataset == "dapo_math":
            write_dapo_math_source(upstream / "dapo-math-17k.parquet")
        elif dataset == "aime2024":
            src = write_aime2024_source(upstream / "aime-2024.parquet")
            # DAPO's validation set: data.prepare names only the training set, so prepare it here
            from rlzoo.kernel.plugins import get_plugin_manager

            prepare = get_plugin_manager().get("dataset", "aime2024").load()
            prepare(base, {"source": str(src), "dedup": True})
        elif dataset == "geometry3k":
            write_geometry3k_source(upstream / "geometry3k")
    if model_kind == "qwen2_5_vl":
        build_tiny_qwen2_5_vl(base / "model")
    else:
        build_tiny_qwen2(base / "model")
    done.write_text(json.dumps({"recipe": recipe, "datasets": datasets, "model": model_kind}))
    return base


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rlzoo.models.tiny",
        description="Write the tiny model and upstream-layout data of a recipe's tiny variant "
        "(then: rlzoo train RECIPE +tiny=RECIPE).",
    )
    p.add_argument("recipes", nargs="*", help="recipes (default: every recipe with a tiny variant)")
    p.add_argument("--root", help=f"output root (default: ${ENV_TINY_DIR} or ~/.cache/rlzoo/tiny)")
    p.add_argument("--overwrite", action="store_true", help="rebuild even when the files exist")
    ns = p.parse_args(argv)
    for r in ns.recipes or list(tiny_inputs()):
        print(build_tiny(r, ns.root, overwrite=ns.overwrite))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
