"""The pieces every runner composes: inputs, rewards, batches, the policy update, validation, checkpoints.

Runners differ only in *when* these run and *where* (threads, Ray actors). Nothing here branches on
a part's name: parts are asked for their capabilities.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlzoo.batch import Batch
from rlzoo.config import RecipeConfig, Selection
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.metrics import mean_metrics
from rlzoo.objective import PolicyObjective, ValueObjective, agg_context
from rlzoo.protocols import (
    AdvantageInputs,
    CorrectionInputs,
    GenerationRequest,
    RewardItem,
    RewardResult,
    RolloutSpec,
    Sample,
    SamplingParams,
    TrainSpec,
)

logger = logging.getLogger("rlzoo")


# ---------------------------------------------------------------------------------------------
# Inputs: data preparation and the checks that run before any model loads
# ---------------------------------------------------------------------------------------------
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
    from rlzoo.backends.native.multimodal import has_vision_config
    from rlzoo.backends.native.multimodal import load_processor as _load

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
        total_steps=max(1, total_steps),
        trust_remote_code=cfg.model.trust_remote_code,
        pad_token_id=int(tokenizer.pad_token_id),
        temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0,
    )


def rollout_spec(cfg: RecipeConfig, tokenizer: Any) -> RolloutSpec:
    return RolloutSpec(
        model_path=expand(cfg.model.path),
        tokenizer_path=expand(cfg.model.tokenizer_path or cfg.model.path),
        seed=cfg.run.seed,
        dtype=cfg.model.dtype,
        device=resolve_device(cfg.model.device),
        trust_remote_code=cfg.model.trust_remote_code,
        max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.data.max_response_length,
        eos_token_ids=eos_ids(tokenizer, expand(cfg.model.path)),
        pad_token_id=int(tokenizer.pad_token_id),
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


# ---------------------------------------------------------------------------------------------
# Rewards
# ---------------------------------------------------------------------------------------------
class ScorerDispatch:
    """``scorer(response, ground_truth, data_source, extra_info)`` choosing a scorer per data source.

    Picklable (it holds lazy ``module:attr`` targets and params), so process-pool reward managers
    can ship it to workers.
    """

    def __init__(self, default: Selection, by_source: Mapping[str, Selection]) -> None:
        self._default = (default.component.target, default.params)
        self._by_source = {k: (s.component.target, s.params) for k, s in by_source.items() if s is not None}
        self._cache: dict[Any, Any] = {}

    def _fn(self, target: Any) -> Any:
        if not isinstance(target, str):
            return target
        if target not in self._cache:
            from rlzoo.registry import _resolve

            self._cache[target] = _resolve(target)
        return self._cache[target]

    def __call__(
        self, response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any]
    ) -> Any:
        target, params = self._by_source.get(data_source, self._default)
        return self._fn(target)(response, ground_truth, data_source, extra_info, params)

    def __getstate__(self) -> dict[str, Any]:
        return {"_default": self._default, "_by_source": self._by_source, "_cache": {}}


def build_reward_manager(cfg: RecipeConfig) -> Any:
    mgr = cfg.reward.manager
    scorer = ScorerDispatch(cfg.reward.scorer, cfg.reward.scorers)
    return mgr.fn(mgr.params, scorer)


def score_samples(reward_manager: Any, tokenizer: Any, samples: Sequence[Sample]) -> list[RewardResult]:
    """Decode and score samples; a manager that raises marks the whole call failed, never the run."""
    items = [
        RewardItem(
            response=tokenizer.decode(s.response_ids, skip_special_tokens=True),
            ground_truth=s.data.get("ground_truth"),
            data_source=str(s.data.get("data_source", "default")),
            prompt=str(s.data.get("prompt_text", "")),
            response_length=len(s.response_ids),
            finish_reason=s.finish_reason,
            extra_info=s.data.get("extra_info") or {},
        )
        for s in samples
    ]
    try:
        results = list(reward_manager(items))
    except Exception as exc:  # a broken manager: count every sample as failed
        logger.warning("reward manager failed on %d samples: %s", len(items), exc)
        return [RewardResult(0.0, 0.0, True, {"error": repr(exc)}) for _ in items]
    for r in results:
        if not (isinstance(r.reward, (int, float)) and math.isfinite(r.reward)):
            r.reward, r.failed = 0.0, True
    return results


# ---------------------------------------------------------------------------------------------
# Requests and batches
# ---------------------------------------------------------------------------------------------
def sampling_params(
    cfg: RecipeConfig, *, val: bool = False, n: int | None = None, seed: int | None = None
) -> SamplingParams:
    s = cfg.rollout.val if val else cfg.rollout
    greedy = s.temperature <= 0
    return SamplingParams(
        n=n if n is not None else s.n,
        temperature=1.0 if greedy else s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_new_tokens=cfg.data.max_response_length,
        greedy=greedy,
        seed=seed,
    )


def make_requests(
    items: Sequence[Mapping[str, Any]], sampling: SamplingParams, prefix: str, processor: Any = None
) -> list[GenerationRequest]:
    """One request per dataset item.

    An item with images gets ``multi_modal={"images": [...]}``; with a VL ``processor`` (see
    :func:`load_processor`) its ``prompt_ids`` are the processor's (one image token per merged
    patch) and ``multi_modal`` also holds ``pixel_values`` / ``image_grid_thw``
    (:func:`rlzoo.backends.native.multimodal.expand_prompt`).
    """
    reqs = []
    for j, it in enumerate(items):
        data = {k: it.get(k) for k in ("ground_truth", "data_source", "extra_info", "prompt_text", "index")}
        seed = None if sampling.seed is None else sampling.seed * 1_000_003 + j
        sp = sampling if seed is None else SamplingParams(**{**sampling.__dict__, "seed": seed})
        images = it.get("images")
        prompt_ids = list(it["prompt_ids"])
        multi_modal: dict[str, Any] | None = {"images": images} if images else None
        if images and processor is not None:
            from rlzoo.backends.native.multimodal import expand_prompt

            prompt_ids, pixels = expand_prompt(processor, it["prompt_text"], images)
            multi_modal = {"images": images, **pixels}
        reqs.append(
            GenerationRequest(
                request_id=f"{prefix}-{j}",
                prompt_ids=prompt_ids,
                sampling=sp,
                data=data,
                multi_modal=multi_modal,
            )
        )
    return reqs


def samples_to_batch(
    samples: Sequence[Sample],
    results: Sequence[RewardResult] | None,
    pad_token_id: int,
    *,
    max_response_length: int | None = None,
) -> Batch:
    """Collate samples into the training layout (see :mod:`rlzoo.batch`)."""
    B = len(samples)
    P = max(len(s.prompt_ids) for s in samples)
    T = max(max((len(s.response_ids) for s in samples), default=1), 1)
    if max_response_length:
        T = min(T, max_response_length)
    input_ids = torch.full((B, P + T), pad_token_id, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    rlp = torch.zeros((B, T), dtype=torch.float32)
    scores = torch.zeros((B, T), dtype=torch.float32)
    for i, s in enumerate(samples):
        p = len(s.prompt_ids)
        r = s.response_ids[:T]
        input_ids[i, P - p : P] = torch.tensor(s.prompt_ids, dtype=torch.long)
        attn[i, P - p : P] = 1
        if r:
            input_ids[i, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
            attn[i, P : P + len(r)] = 1
            rlp[i, : len(r)] = torch.tensor(s.rollout_log_probs[: len(r)], dtype=torch.float32)
            if results is not None:
                scores[i, len(r) - 1] = float(results[i].reward)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    response_mask = attn[:, P:].clone()
    groups: dict[str, int] = {}
    gids = torch.tensor([groups.setdefault(s.request_id, len(groups)) for s in samples], dtype=torch.long)
    batch = Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attn,
            "position_ids": position_ids,
            "responses": input_ids[:, P:].clone(),
            "response_mask": response_mask,
            "rollout_log_probs": rlp,
            "token_level_scores": scores,
            "group_ids": gids,
        },
        {
            "uid": [s.uid for s in samples],
            "request_id": [s.request_id for s in samples],
            "data_source": [str(s.data.get("data_source", "default")) for s in samples],
            "versions": [list(s.versions) for s in samples],
            "finish_reason": [s.finish_reason for s in samples],
        },
    )
    if any(s.multi_modal for s in samples):  # a VL trainer's pixel inputs, row by row (None: text)
        batch["multi_modal"] = [s.multi_modal for s in samples]
    if results is not None:
        batch["failed"] = [bool(r.failed) for r in results]
        batch["score"] = [float(r.score) for r in results]
        batch["acc"] = [float(r.info.get("acc", r.score)) for r in results]
    return batch


def clip_ratio(
    resp_len: torch.Tensor, finish_reasons: Sequence[str] | None, max_response_length: int
) -> float:
    """Share of responses cut off by the length limit: they reached ``max_response_length`` tokens
    without ending in EOS (finish reason other than ``"stop"``). A response whose EOS is exactly
    the last allowed token is complete, not clipped. Without finish reasons, length alone decides."""
    hit = resp_len >= max_response_length  # [B]
    if finish_reasons is not None:
        no_eos = torch.tensor([r != "stop" for r in finish_reasons], dtype=torch.bool)  # [B]
        hit = hit & no_eos
    return hit.float().mean().item()


def rollout_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    resp_len = batch["response_mask"].sum(-1).float()  # [B]
    prompt_len = (batch["attention_mask"].sum(-1) - batch["response_mask"].sum(-1)).float()  # [B]
    seq_scores = batch["token_level_scores"].sum(-1)  # [B]
    out = {
        "critic/score/mean": seq_scores.mean().item(),
        "critic/score/max": seq_scores.max().item(),
        "critic/score/min": seq_scores.min().item(),
        "response_length/mean": resp_len.mean().item(),
        "response_length/max": resp_len.max().item(),
        "response_length/min": resp_len.min().item(),
        "response_length/clip_ratio": clip_ratio(resp_len, batch.get("finish_reason"), max_response_length),
        "prompt_length/mean": prompt_len.mean().item(),
        "reward/failed": float(sum(batch.get("failed", []) or [0])),
    }
    if "acc" in batch:
        out["critic/acc/mean"] = sum(batch["acc"]) / max(len(batch), 1)
    versions = batch.get("versions")
    if versions:
        spans = [max(v) - min(v) if v else 0 for v in versions]
        out["rollout/partial_ratio"] = sum(1 for s in spans if s > 0) / len(spans)
        out["rollout/version_span/max"] = float(max(spans))
    return out


# ---------------------------------------------------------------------------------------------
# The policy update (shared by every runner)
# ---------------------------------------------------------------------------------------------
class PolicyTrainer:
    """Samples -> old / ref log-probs, values, rewards, advantages -> PPO epochs over mini-batches."""

    def __init__(self, cfg: RecipeConfig, backend: Any) -> None:
        self.cfg = cfg
        self.backend = backend
        alg = cfg.algorithm
        self.adv: Selection = alg.advantage
        self.needs_critic = bool(self.adv.capability("needs_critic"))
        self.needs_ref = alg.use_kl_loss or alg.use_kl_in_reward
        self.kl_ctrl: Any = None
        if alg.use_kl_in_reward:
            from rlzoo.algorithms.functional.kl import AdaptiveKLController, FixedKLController

            kc = alg.kl_ctrl
            self.kl_ctrl = (
                AdaptiveKLController(kc.kl_coef, kc.target_kl, kc.horizon)
                if kc.type == "adaptive"
                else FixedKLController(kc.kl_coef)
            )
        self.step_count = 0

    # -- phases ---------------------------------------------------------------------------------
    def prepare(self, batch: Batch, timer: Callable[[str], Any]) -> dict[str, float]:
        """Fill old / ref log-probs, values, token rewards, correction weights and advantages."""
        alg, m = self.cfg.algorithm, {}
        corr: Selection | None = alg.rollout_correction
        bypass = corr is not None and getattr(corr.params, "mode", "decoupled") == "bypass"
        with timer("old_log_prob"):
            if bypass:
                batch["old_log_probs"] = batch["rollout_log_probs"].clone()
            else:
                batch["old_log_probs"], _ = self.backend.compute_log_probs(batch)
        if self.needs_ref:
            with timer("ref"):
                batch["ref_log_probs"], _ = self.backend.compute_log_probs(batch, model="ref")
        if self.needs_critic:
            with timer("values"):
                batch["values"] = self.backend.compute_values(batch)
        with timer("adv"):
            mask = batch["response_mask"].float()
            if alg.use_kl_in_reward:
                from rlzoo.algorithms.functional.kl import apply_kl_penalty

                kl = alg.kl_penalty(batch["old_log_probs"], batch["ref_log_probs"])
                rewards, km = apply_kl_penalty(batch["token_level_scores"], kl, mask, self.kl_ctrl.value)
                self.kl_ctrl.update(km["reward_kl_penalty"], n_steps=len(batch))
                batch["token_level_rewards"] = rewards
                m.update({f"actor/{k}": v for k, v in km.items()})
            else:
                batch["token_level_rewards"] = batch["token_level_scores"]
            if corr is not None:
                out = corr(
                    CorrectionInputs(
                        batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
                    )
                )
                if out.weights is not None:
                    batch["rollout_is_weights"] = out.weights.detach()
                batch["response_mask"] = out.mask.to(batch["response_mask"].dtype)
                m.update({f"rollout_corr/{k}": v for k, v in out.metrics.items()})
            else:
                from rlzoo.algorithms.functional.correction import offpolicy_metrics

                m.update(
                    {
                        f"rollout_corr/{k}": v
                        for k, v in offpolicy_metrics(
                            batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
                        ).items()
                    }
                )
            inputs = AdvantageInputs(
                token_level_rewards=batch["token_level_rewards"],
                response_mask=batch["response_mask"],
                group_ids=batch["group_ids"],
                values=batch.get("values"),
                baseline_rewards=batch.get("baseline_rewards"),
            )
            out_adv = self.adv(inputs)
            batch["advantages"], batch["returns"] = out_adv.advantages, out_adv.returns
        valid = batch["response_mask"].bool()
        if valid.any():
            a = batch["advantages"][valid]
            m["critic/advantages/mean"] = a.mean().item()
            m["critic/advantages/max"] = a.max().item()
            m["critic/advantages/min"] = a.min().item()
            m["critic/rewards/mean"] = batch["token_level_rewards"].sum(-1).mean().item()
        return m

    def mini_batches(self, batch: Batch, epoch: int) -> list[Batch]:
        n = self.cfg.rollout.n
        mb_prompts = self.cfg.trainer.ppo_mini_batch_size
        size = len(batch) if mb_prompts is None else mb_prompts * n
        if self.cfg.trainer.shuffle_mini_batches:
            g = torch.Generator().manual_seed(self.cfg.run.seed * 7919 + self.step_count * 31 + epoch)
            batch = batch.select(torch.randperm(len(batch), generator=g))
        return batch.split(max(1, size))

    def update(self, batch: Batch, timer: Callable[[str], Any]) -> dict[str, float]:
        cfg, alg = self.cfg, self.cfg.algorithm
        metrics: list[dict[str, float]] = []
        for epoch in range(cfg.trainer.ppo_epochs):
            for mb in self.mini_batches(batch, epoch):
                ctx = agg_context(mb, cfg.data.max_response_length)
                if self.needs_critic:
                    with timer("update_critic"):
                        vobj = ValueObjective(
                            alg.loss_agg, ctx, getattr(self.adv.params, "cliprange_value", 0.5)
                        )
                        cm = self.backend.update_critic(mb, vobj)
                        metrics.append({**cm, **vobj.summary()})
                if self.step_count >= cfg.trainer.critic_warmup:
                    with timer("update_actor"):
                        obj = PolicyObjective(
                            alg.policy_loss,
                            alg.loss_agg,
                            ctx,
                            kl_loss=alg.kl_loss if alg.use_kl_loss else None,
                            kl_coef=alg.kl_loss_coef if alg.use_kl_loss else 0.0,
                            entropy_coeff=alg.entropy_coeff,
                        )
                        am = self.backend.update_policy(mb, obj)
                        metrics.append({**am, **obj.summary()})
        self.step_count += 1
        return mean_metrics(metrics)

    def step(self, batch: Batch, timer: Callable[[str], Any]) -> dict[str, float]:
        m = self.prepare(batch, timer)
        m.update(self.update(batch, timer))
        return m

    def state_dict(self) -> dict[str, Any]:
        return {
            "step_count": self.step_count,
            "kl_coef": None if self.kl_ctrl is None else self.kl_ctrl.value,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step_count = int(state.get("step_count", 0))
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = float(state["kl_coef"])


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def validation_metrics(
    samples: Sequence[Sample], results: Sequence[RewardResult], n: int
) -> dict[str, float]:
    """mean@n, best@n and maj@n (when scorers report ``pred``) per data source and overall."""
    groups: dict[str, list[tuple[Sample, RewardResult]]] = defaultdict(list)
    for s, r in zip(samples, results):
        groups[s.request_id].append((s, r))
    per_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for members in groups.values():
        source = str(members[0][0].data.get("data_source", "default"))
        accs = [float(r.info.get("acc", r.score)) for _, r in members]
        per_source[source][f"mean@{n}"].append(sum(accs) / len(accs))
        per_source[source][f"best@{n}"].append(max(accs))
        preds = [r.info.get("pred") for _, r in members]
        if all(p is not None for p in preds):
            top = Counter(map(str, preds)).most_common(1)[0][0]
            per_source[source][f"maj@{n}"].append(next(a for p, a in zip(map(str, preds), accs) if p == top))
    out: dict[str, float] = {}
    overall: list[float] = []
    for source, stats in per_source.items():
        for k, v in stats.items():
            out[f"val/{source}/{k}"] = sum(v) / len(v)
        overall += stats[f"mean@{n}"]
    if overall:
        out["val/mean"] = sum(overall) / len(overall)
    out["val/response_length/mean"] = sum(len(s.response_ids) for s in samples) / max(len(samples), 1)
    return out


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------
@dataclass
class CheckpointManager:
    """``run_dir/checkpoints/step_<k>/``; ``latest`` names the newest complete one."""

    run_dir: Path
    keep: int = 2
    saved: list[Path] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.run_dir / "checkpoints"

    def save(self, step: int, backend: Any, extra_state: Mapping[str, Any]) -> Path:
        path = self.root / f"step_{step}"
        if path.exists():
            shutil.rmtree(path)
        self.root.mkdir(parents=True, exist_ok=True)
        state = dict(extra_state)
        state["python_random"] = _encode_random_state()
        backend.save_checkpoint(path, state)
        tmp = self.root / "latest.tmp"
        tmp.write_text(path.name)
        tmp.replace(self.root / "latest")
        self.saved.append(path)
        existing = sorted(self.root.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        for old in existing[: max(0, len(existing) - max(1, self.keep))]:
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        return path

    def latest(self) -> Path | None:
        marker = self.root / "latest"
        if not marker.exists():
            return None
        path = self.root / marker.read_text().strip()
        return path if path.exists() else None

    def load(self, backend: Any) -> dict[str, Any] | None:
        path = self.latest()
        if path is None:
            return None
        state = dict(backend.load_checkpoint(path))
        if "python_random" in state:
            _decode_random_state(state.pop("python_random"))
        return state


def _encode_random_state() -> Any:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _decode_random_state(state: Any) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
