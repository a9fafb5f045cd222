"""Inputs: data preparation, the checks that run before any model loads, tokenizer, specs, datasets.

Everything here reads the recipe: it is the edge where a :class:`~rlzoo.recipe.types.RecipeConfig` turns
into the flat objects the loop and the backends take.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlzoo.kernel.errors import ConfigError, RlzooError
from rlzoo.kernel.settings import RolloutSpec, TrainSpec
from rlzoo.recipe.types import RecipeConfig, Selection, optimizer_steps

logger = logging.getLogger("rlzoo")


def expand(p: str) -> str:
    return str(Path(p).expanduser())


def ensure_data(cfg: RecipeConfig) -> None:
    """Run ``data.prepare`` when a training file (or the model it ships) is missing."""
    files = [expand(f) for f in [*cfg.data.train_files, *cfg.data.val_files]]
    missing = [f for f in files if not Path(f).exists()]
    model_missing = _is_local_path(cfg.model.path) and not Path(expand(cfg.model.path)).exists()
    if not missing and not model_missing:
        return
    prep = cfg.data.prepare
    if not isinstance(prep, Selection):
        return  # check_inputs reports the missing files
    if not cfg.data.dir:
        raise ConfigError(["data.dir: data.prepare needs data.dir, the folder it writes into"])
    out = Path(expand(cfg.data.dir))
    out.mkdir(parents=True, exist_ok=True)
    logger.info("preparing dataset %r into %s", prep.name, out)
    prep.fn(out, prep.params)


def _is_local_path(p: str) -> bool:
    return p.startswith(("/", "./", "../", "~")) or Path(expand(p)).exists()


def check_inputs(cfg: RecipeConfig) -> None:
    """Model path, tokenizer chat template, dataset columns: clear errors before a model loads."""
    problems: list[str] = []
    for key, path in (("model.path", cfg.model.path), ("model.tokenizer_path", cfg.model.tokenizer_path)):
        if path and _is_local_path(path) and not Path(expand(path)).exists():
            problems.append(
                f"{key}: {path!r} does not exist (give a local folder with config.json, or a hub name)"
            )
    for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        for f in files:
            if not Path(expand(f)).exists():
                problems.append(
                    f"{key}: {f!r} does not exist (prepare it with `rlzoo prepare NAME` or set data.prepare)"
                )
    if problems:
        raise ConfigError(problems, header="inputs missing")
    from rlzoo.data.schema import validate_files

    for files in (cfg.data.train_files, cfg.data.val_files):
        if files:
            validate_files([expand(f) for f in files], prompt_key=cfg.data.prompt_key)


def load_tokenizer(cfg: RecipeConfig) -> Any:
    from rlzoo.data.tokenizer import load_tokenizer as _load

    path = expand(cfg.model.tokenizer_path or cfg.model.path)
    try:
        tok = _load(path, trust_remote_code=cfg.model.trust_remote_code)
    except Exception as exc:
        raise RlzooError(f"cannot load the tokenizer from {path!r}: {exc}") from exc
    if cfg.data.apply_chat_template and not getattr(tok, "chat_template", None):
        raise RlzooError(
            f"the tokenizer at {path!r} has no chat template; give a tokenizer with one "
            "(tokenizer_config.json 'chat_template') or set data.apply_chat_template=false"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_processor(cfg: RecipeConfig) -> Any:
    """The multimodal processor of a vision-language model (its config has a ``vision_config``,
    e.g. Qwen2.5-VL), loaded from the tokenizer's folder; None for a text model."""
    from rlzoo.models.processor import has_vision_config
    from rlzoo.models.processor import load_processor as _load

    model_path = expand(cfg.model.path)
    try:
        is_vl = has_vision_config(model_path, cfg.model.trust_remote_code)
    except Exception as exc:  # no readable config: a text model as far as inputs go
        logger.debug("no model config at %r (%s): no processor", model_path, exc)
        return None
    if not is_vl:
        return None
    path = expand(cfg.model.tokenizer_path or cfg.model.path)
    try:
        return _load(path, cfg.model.trust_remote_code)
    except Exception as exc:
        raise RlzooError(
            f"cannot load the processor of the vision-language model from {path!r}: {exc}"
        ) from exc


def eos_ids(tokenizer: Any, model_path: str) -> tuple[int, ...]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    try:
        from transformers import GenerationConfig

        gc = GenerationConfig.from_pretrained(model_path)
        e = gc.eos_token_id
        ids.update([e] if isinstance(e, int) else list(e or []))
    except Exception:
        pass
    return tuple(sorted(ids))


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def train_spec(cfg: RecipeConfig, total_steps: int, tokenizer: Any) -> TrainSpec:
    adv = cfg.algorithm.advantage
    return TrainSpec(
        model_path=expand(cfg.model.path),
        seed=cfg.run.seed,
        need_reference=cfg.algorithm.use_kl_loss or cfg.algorithm.use_kl_in_reward,
        need_critic=bool(isinstance(adv, Selection) and adv.capability("needs_critic")),
        critic_model_path=expand(cfg.model.critic_path) if cfg.model.critic_path else None,
        total_steps=optimizer_steps(cfg, total_steps),  # total_steps counts trainer steps
        trust_remote_code=cfg.model.trust_remote_code,
        pad_token_id=int(tokenizer.pad_token_id),
        temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0,
        optim=cfg.trainer.optim,
        micro_batch=cfg.trainer.micro_batch,
        lora=cfg.trainer.lora,
    )


def rollout_spec(cfg: RecipeConfig, tokenizer: Any) -> RolloutSpec:
    return RolloutSpec(
        model_path=expand(cfg.model.path),
        tokenizer_path=expand(cfg.model.tokenizer_path or cfg.model.path),
        seed=cfg.run.seed,
        dtype=cfg.model.dtype,
        device=resolve_device(cfg.model.device),
        trust_remote_code=cfg.model.trust_remote_code,
        # multi-turn: each turn's prompt is the trajectory so far (prompt + earlier turns)
        max_prompt_length=cfg.data.max_prompt_length
        + (cfg.data.max_response_length if cfg.rollout.environment is not None else 0),
        max_response_length=cfg.data.max_response_length,
        eos_token_ids=eos_ids(tokenizer, expand(cfg.model.path)),
        pad_token_id=int(tokenizer.pad_token_id),
        lora=cfg.trainer.lora,
    )


def build_datasets(cfg: RecipeConfig, tokenizer: Any, processor: Any = None) -> tuple[Any, Any | None]:
    """Train and validation :class:`~rlzoo.data.dataset.PromptDataset` (``processor``: a VL model's,
    see :func:`load_processor`; it renders image placeholders and counts expanded image tokens)."""
    from rlzoo.data.dataset import PromptDataset

    def make(files: Sequence[str]) -> Any:
        return PromptDataset(
            [expand(f) for f in files],
            tokenizer,
            prompt_key=cfg.data.prompt_key,
            max_prompt_length=cfg.data.max_prompt_length,
            truncation=cfg.data.truncation,
            strict=cfg.data.strict,
            apply_chat_template=cfg.data.apply_chat_template,
            processor=processor,
        )

    train = make(cfg.data.train_files)
    if len(train) < cfg.data.train_batch_size:
        raise ConfigError(
            [
                f"data.train_batch_size: {cfg.data.train_batch_size} prompts per step, but the training data has "
                f"only {len(train)} usable prompts"
            ]
        )
    val = make(cfg.data.val_files) if cfg.data.val_files else None
    return train, val


def multi_turn_rollout(cfg: RecipeConfig, inner: Any, tokenizer: Any, spec: RolloutSpec) -> Any:
    """``inner`` wrapped in a :class:`rlzoo.agents.rollout.MultiTurnRollout` for
    ``rollout.environment`` (one environment per trajectory), ``rollout.tools`` and
    ``rollout.multi_turn``."""
    from functools import partial

    from rlzoo.agents.rollout import MultiTurnRollout

    env = cfg.rollout.environment
    tools = [sel.fn(sel.params) for sel in cfg.rollout.tools]
    return MultiTurnRollout(
        inner,
        partial(env.fn, env.params),
        tokenizer,
        cfg.rollout.multi_turn,
        max_response_length=cfg.data.max_response_length,
        stop_ids=spec.eos_token_ids,
        tools=tools,
    )
