"""Backend contract suites: what every rollout / train backend must do, checked against HF forwards.

A backend package subclasses the suite of its kind in a pytest module (name starting with ``Test``)::

    from rlzoo.testing.backends import TrainBackendContract

    class TestMyTrainer(TrainBackendContract):
        name = "my_trainer"
        requires = ("my_heavy_dep",)     # skipped with a reason when not importable
        needs_cuda = True                # skipped with a reason without a CUDA GPU

Both suites build a tiny Qwen2 (``Qwen2Config``: hidden 32, 2 layers, 4 heads, 2 KV heads, vocab
64, fp32) in a temporary directory, load it with plain ``transformers`` as the reference, and build
the backend through the registry (``factory(params, spec)``), exactly as a run would. The
registration checks of :class:`~rlzoo.testing.conformance.ComponentConformance` (doc line,
documented params, target importable) run even where the backend cannot.

Rollout contract (:class:`RolloutBackendContract`): rollout log-probs equal ``log_softmax(logits /
T)`` of a reference forward at the sampled tokens; ``update_weights`` with another model's export
reproduces that model's log-probs; pause / update / resume keeps the tokens generated before the
pause (their versions and log-probs belong to the old weights, the rest to the new); ``stream``
yields every sample exactly once; the same seed gives the same samples.

Train contract (:class:`TrainBackendContract`): ``compute_log_probs`` equals a reference forward;
``export_weights`` after an update loads into a fresh HF model that reproduces the backend's
log-probs; save → load → next update is identical to not stopping; one mini-batch in 1 or ``B``
micro-batches gives the same update (gradient accumulation invariance).
"""

from __future__ import annotations

import importlib.util
import random
import tempfile
import time
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rlzoo.kernel.protocols import GenerationRequest, RolloutBackend, SamplingParams, TrainBackend
from rlzoo.kernel.settings import OptimSettings, RolloutSpec, TrainSpec
from rlzoo.models.tiny import tiny_qwen2_config
from rlzoo.testing.conformance import ComponentConformance

__all__ = [
    "BackendContract",
    "RolloutBackendContract",
    "TokenMeanObjective",
    "TrainBackendContract",
    "make_train_batch",
    "padded_ids",
    "reference_batch_log_probs",
    "response_logits",
    "save_tiny_qwen2",
]

VOCAB = 64
PAD = 0
LONG = 200  # tokens of the long sample of the pause test: still running when the short one ends


# ---------------------------------------------------------------------------------------------
# fixtures as plain functions (the suites take no pytest fixtures)
# ---------------------------------------------------------------------------------------------
def save_tiny_qwen2(path: str | Path, *, seed: int = 0, tie: bool = False, **config: Any) -> Path:
    """A tiny Qwen2 causal LM (~20k params + embeddings, fp32) saved with ``save_pretrained``.

    ``config``: ``Qwen2Config`` fields over the tiny defaults (e.g. ``hidden_size=128,
    num_attention_heads=2, num_key_value_heads=1`` for head_dim 64, what vLLM's CPU attention needs).

    Also saves a word-level tokenizer over the same 64 ids (``<pad>`` = 0, ``<eos>`` = 1), so
    engines that insist on a tokenizer can load the directory.
    """
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    torch.manual_seed(seed)
    cfg = tiny_qwen2_config(
        VOCAB,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=PAD,
        **config,
    )
    model = AutoModelForCausalLM.from_config(cfg).float()
    model.save_pretrained(str(path))
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(
        str(path)
    )
    return path


def _load_reference(path: str | Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype="float32").eval()


def reference_log_probs(
    model: Any, prompt: Sequence[int], response: Sequence[int], temperature: float
) -> list[float]:
    """``log_softmax(logits / T)`` of ``response`` given ``prompt`` under an HF model (fp32)."""
    import torch

    ids = torch.tensor([[*prompt, *response]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # [P+R, V]
    P = len(prompt)
    lp = torch.log_softmax(logits[P - 1 : P - 1 + len(response)] / temperature, -1)  # [R, V]
    return lp.gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()


def padded_ids(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    P: int | None = None,
    T: int | None = None,
) -> tuple[Any, Any]:
    """``(input_ids, attention_mask)``, both ``[B, P + T]`` long, in the rlzoo.kernel.batch layout: each prompt
    left-padded to ``P`` (default: the longest), each response right-padded to ``T``; pad id 0."""
    import torch

    P = P or max(map(len, prompts))
    T = T or max(map(len, responses))
    B = len(prompts)
    ids = torch.full((B, P + T), PAD, dtype=torch.long)
    attn = torch.zeros(B, P + T, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, P - len(p) : P] = torch.tensor(list(p))
        ids[i, P : P + len(r)] = torch.tensor(list(r))
        attn[i, P - len(p) : P + len(r)] = 1
    return ids, attn


def response_logits(model: Any, batch: Any) -> Any:
    """A plain HF forward of ``batch`` (rlzoo.kernel.batch layout): the logits that predict each response
    token, in float64, ``[B, T, V]`` (position ``P + t - 1`` predicts response token ``t``)."""
    import torch

    T = batch["responses"].shape[1]
    P = batch["input_ids"].shape[1] - T
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits.double()  # [B, P+T, V]
    return logits[:, P - 1 : P + T - 1]  # [B, T, V]


def reference_batch_log_probs(model: Any, batch: Any, temperature: float) -> Any:
    """``log_softmax(logits / T)`` at each response token of ``batch`` under an HF model (fp32),
    ``[B, T]``, zero on response padding."""
    import torch

    T = batch["responses"].shape[1]
    logits = response_logits(model, batch).float()  # [B, T, V] (fp32 -> fp64 -> fp32: exact)
    lp = torch.log_softmax(logits / temperature, -1)  # [B, T, V]
    lp = lp.gather(-1, batch["responses"][..., None])[..., 0]  # [B, T]
    return torch.where(batch["attention_mask"][:, -T:].bool(), lp, 0.0)


def make_train_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], seed: int = 0
) -> Any:
    """rlzoo.kernel.batch layout (prompt left-padded, response right-padded) + advantages / old log-probs."""
    import torch

    from rlzoo.kernel.batch import Batch

    ids, attn = padded_ids(prompts, responses)
    B, T = len(prompts), max(map(len, responses))
    P = ids.shape[1] - T
    g = torch.Generator().manual_seed(seed)
    mask = attn[:, P:].float()  # [B, T]
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, P:],
            "response_mask": mask,
            "old_log_probs": -torch.rand(B, T, generator=g) * 3 * mask,
            "advantages": torch.randn(B, T, generator=g) * mask,
            "returns": torch.randn(B, T, generator=g) * mask,
            "values": torch.zeros(B, T),
        }
    )


def _random_batch(seed: int, B: int = 6) -> Any:
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 7))] for _ in range(B)]
    responses = [[rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 8))] for _ in range(B)]
    return make_train_batch(prompts, responses, seed=seed)


class TokenMeanObjective:
    """``-mean(ratio · A)`` over the mini-batch's unmasked tokens, normalised by the global count.

    Micro-batch losses sum to the full-batch loss, the contract every train backend relies on.
    """

    needs_entropy = False

    def __init__(self, mini_batch: Any) -> None:
        self.total = float(mini_batch["response_mask"].sum())

    def __call__(self, mb: Any, log_probs: Any, entropy: Any) -> tuple[Any, dict[str, Any]]:
        import torch

        mask = mb["response_mask"]  # [b, T]
        ratio = torch.exp(log_probs - mb["old_log_probs"])  # [b, T]
        loss = -(ratio * mb["advantages"] * mask).sum() / self.total  # scalar
        return loss, {}


class NonFiniteObjective(TokenMeanObjective):
    """:class:`TokenMeanObjective` times NaN: every gradient is NaN (a step the backend must skip)."""

    def __call__(self, mb: Any, log_probs: Any, entropy: Any) -> tuple[Any, dict[str, Any]]:
        loss, info = super().__call__(mb, log_probs, entropy)
        return loss * float("nan"), info


# ---------------------------------------------------------------------------------------------
# the base: availability and building
# ---------------------------------------------------------------------------------------------
class BackendContract(ComponentConformance):
    """Availability (``requires``, ``needs_cuda``) and the tiny model shared by both suites."""

    #: modules that must import for the numeric tests to run (skipped with a reason otherwise)
    requires: ClassVar[tuple[str, ...]] = ()
    #: the numeric tests need a CUDA GPU
    needs_cuda: ClassVar[bool] = False
    #: spec fields on top of the suite's defaults (e.g. {"device": "cuda"})
    spec_overrides: ClassVar[Mapping[str, Any]] = {}
    #: tolerance of log-prob comparisons (bf16 engines need more)
    lp_atol: ClassVar[float] = 1e-4
    #: whether the tiny model ties its embeddings
    tie_word_embeddings: ClassVar[bool] = False
    #: ``Qwen2Config`` fields over the tiny model's defaults (e.g. a head_dim an engine's kernels take)
    model_config: ClassVar[Mapping[str, Any]] = {}
    #: the Protocol every backend of the kind satisfies
    protocol: ClassVar[type[Any]]

    def unavailable(self) -> str | None:
        """Why the numeric tests cannot run here (None: they can)."""
        for mod in self.requires:
            try:
                found = importlib.util.find_spec(mod) is not None
            except ModuleNotFoundError:  # a parent package is missing
                found = False
            if not found:
                return f"{mod} not installed"
        if self.needs_cuda:
            import torch

            if not torch.cuda.is_available():
                return "needs a CUDA GPU"
        return None

    def require(self) -> None:
        reason = self.unavailable()
        if reason:
            pytest.skip(f"{self.kind} {self.name!r}: {reason}")

    @cached_property
    def _tmp(self) -> Path:
        d = tempfile.TemporaryDirectory(prefix="rlzoo-contract-")
        self._tmp_handle = d  # removed when the suite object goes away
        return Path(d.name)

    def model_dir(self, seed: int = 0) -> Path:
        """The tiny model of ``seed``, saved once per suite object."""
        path = self._tmp / f"qwen2-{seed}"
        if not path.exists():
            save_tiny_qwen2(path, seed=seed, tie=self.tie_word_embeddings, **self.model_config)
        return path

    def build(self, spec: Any) -> Any:
        """``factory(params, spec)`` of the registered backend."""
        return self.component.load()(self.params, spec)

    def default_backend(self) -> Any:
        """The backend with the suite's default spec and params."""
        raise NotImplementedError

    def test_satisfies_protocol(self) -> None:
        self.require()
        b = self.default_backend()
        try:
            assert isinstance(b, self.protocol), f"{type(b).__name__} is not a {self.protocol.__name__}"
        finally:
            b.shutdown()


# ---------------------------------------------------------------------------------------------
# rollout
# ---------------------------------------------------------------------------------------------
class RolloutBackendContract(BackendContract):
    """The :class:`~rlzoo.kernel.protocols.RolloutBackend` contract, against HF forwards of a tiny Qwen2."""

    kind = "rollout_backend"
    protocol = RolloutBackend
    temperature: ClassVar[float] = 0.8

    def spec(self, seed: int = 0, **kw: Any) -> RolloutSpec:
        path = str(self.model_dir(seed))
        base: dict[str, Any] = {
            "model_path": path,
            "tokenizer_path": path,
            "seed": 1234,
            "dtype": "float32",
            "device": "cpu",
            "max_prompt_length": 16,
            "max_response_length": 256,
            "eos_token_ids": (),  # no stop token: responses run to their length (deterministic sizes)
            "pad_token_id": PAD,
        }
        base.update(self.spec_overrides)
        base.update(kw)
        return RolloutSpec(**base)

    def request(
        self, rid: str, prompt: Sequence[int], *, n: int = 1, max_new: int = 8, seed: int | None = 7
    ) -> GenerationRequest:
        sp = SamplingParams(n=n, temperature=self.temperature, max_new_tokens=max_new, seed=seed)
        return GenerationRequest(request_id=rid, prompt_ids=list(prompt), sampling=sp, data={"k": rid})

    def _check_log_probs(self, ref: Any, sample: Any, *, only: Sequence[int] | None = None) -> None:
        expect = reference_log_probs(ref, sample.prompt_ids, sample.response_ids, self.temperature)
        idx = range(len(expect)) if only is None else only
        for i in idx:
            got = sample.rollout_log_probs[i]
            assert abs(got - expect[i]) <= self.lp_atol, (
                f"{sample.uid} token {i}: rollout log-prob {got:.6f} vs reference {expect[i]:.6f}"
            )

    def default_backend(self) -> Any:
        return self.build(self.spec())

    def test_log_probs_match_reference_forward(self) -> None:
        self.require()
        b = self.build(self.spec())
        try:
            reqs = [self.request("a", [3, 4, 5], n=2), self.request("b", [9, 8, 7, 6, 2], max_new=5)]
            samples = b.generate(reqs)
        finally:
            b.shutdown()
        assert [(s.request_id, s.index) for s in samples] == [("a", 0), ("a", 1), ("b", 0)]
        ref = _load_reference(self.model_dir())
        for s in samples:
            assert len(s.response_ids) == len(s.rollout_log_probs) == len(s.versions) > 0
            assert s.prompt_ids == list(reqs[0 if s.request_id == "a" else 1].prompt_ids)
            assert s.data == {"k": s.request_id}
            self._check_log_probs(ref, s)

    def test_update_weights_round_trips_a_trainer_export(self) -> None:
        self.require()
        b = self.build(self.spec(seed=0))
        other = _load_reference(self.model_dir(seed=1))
        try:
            b.update_weights(((k, v.detach().clone()) for k, v in other.state_dict().items()), version=3)
            assert b.version == 3
            (s,) = b.generate([self.request("u", [5, 6, 7], max_new=6)])
        finally:
            b.shutdown()
        assert s.versions == [3] * len(s.response_ids)
        self._check_log_probs(other, s)

    def test_streaming_yields_every_sample_once(self) -> None:
        self.require()
        b = self.build(self.spec())
        try:
            b.submit([self.request(f"r{i}", [2 + i, 10, 11], n=2, max_new=3 + i) for i in range(3)])
            got = [s.uid for s in b.stream(timeout=120)]
            pending = b.num_pending()
        finally:
            b.shutdown()
        assert sorted(got) == sorted(f"r{i}/{j}" for i in range(3) for j in range(2))
        assert pending == 0

    def test_same_seed_same_samples(self) -> None:
        self.require()
        b = self.build(self.spec())
        try:
            first = b.generate([self.request("x", [4, 5, 6], n=2, seed=11)])
            again = b.generate([self.request("y", [4, 5, 6], n=2, seed=11)])
            other = b.generate([self.request("z", [4, 5, 6], n=2, seed=12)])
        finally:
            b.shutdown()
        assert [s.response_ids for s in first] == [s.response_ids for s in again]
        assert [s.response_ids for s in first] != [s.response_ids for s in other]

    def test_pause_update_resume_keeps_tokens(self) -> None:
        """A short and a long request run together; once the short one is done, pause, load other
        weights, resume: the long sample keeps its first tokens (old version, old log-probs) and
        continues under the new weights (new version, new log-probs)."""
        self.require()
        b = self.build(self.spec(seed=0))
        new = _load_reference(self.model_dir(seed=1))
        try:
            b.submit(
                [self.request("long", [3, 4, 5], max_new=LONG), self.request("short", [6, 7], max_new=2)]
            )
            deadline = time.monotonic() + 120
            got = {}
            for s in b.stream(timeout=120):
                got[s.request_id] = s
                if "short" in got or time.monotonic() > deadline:
                    break
            b.pause()
            b.update_weights(((k, v.detach().clone()) for k, v in new.state_dict().items()), version=1)
            b.resume()
            for s in b.stream(timeout=120):
                got[s.request_id] = s
        finally:
            b.shutdown()
        long = got["long"]
        assert long.finish_reason == "length" and len(long.response_ids) == LONG
        assert long.versions == sorted(long.versions) and set(long.versions) <= {0, 1}
        old_n = long.versions.count(0)
        assert 0 < old_n < LONG, f"expected tokens from both versions, got versions {long.versions}"
        self._check_log_probs(_load_reference(self.model_dir(seed=0)), long, only=range(old_n))
        self._check_log_probs(new, long, only=range(old_n, LONG))


# ---------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------
class TrainBackendContract(BackendContract):
    """The :class:`~rlzoo.kernel.protocols.TrainBackend` contract, against HF forwards of a tiny Qwen2."""

    kind = "train_backend"
    protocol = TrainBackend
    #: the params field holding the update's micro-batch size (grad-accumulation invariance)
    micro_batch_field: ClassVar[str] = "micro_batch_size"
    #: params every test binds (on top of params_overrides): a visible LR, no clipping
    contract_params: ClassVar[Mapping[str, Any]] = {"lr": 1e-2, "grad_clip": 0.0}
    #: tolerance of weight / log-prob comparisons after updates
    update_atol: ClassVar[float] = 1e-5

    def spec(self, **kw: Any) -> TrainSpec:
        base: dict[str, Any] = {
            "model_path": str(self.model_dir()),
            "seed": 0,
            "total_steps": 10,
            "temperature": 0.9,
        }
        base.update(self.spec_overrides)
        base.update(kw)
        return TrainSpec(**base)

    def make(self, **params: Any) -> Any:
        """The backend with ``contract_params`` and ``params`` bound: a key its params dataclass
        declares goes there; an optimizer setting (``lr``, ``grad_clip`` ...) or a micro-batch size
        (``micro_batch_size``, ``log_prob_micro_batch_size``, ``max_tokens_per_micro_batch``) goes into
        the spec's shared trainer settings (``TrainSpec.optim`` / ``.micro_batch``)."""
        import dataclasses

        kw = {**self.contract_params, **params}
        own = {f.name for f in dataclasses.fields(self.params)}
        p = dataclasses.replace(self.params, **{k: v for k, v in kw.items() if k in own})
        rest = {k: v for k, v in kw.items() if k not in own}
        optim_fields = {f.name for f in dataclasses.fields(OptimSettings)}
        micro_names = {
            "micro_batch_size": "size",
            "log_prob_micro_batch_size": "log_prob_size",
            "max_tokens_per_micro_batch": "max_tokens",
        }
        optim = {k: rest.pop(k) for k in list(rest) if k in optim_fields}
        micro = {micro_names[k]: rest.pop(k) for k in list(rest) if k in micro_names}
        if rest:
            raise TypeError(f"{self.component.name}: neither params nor trainer settings: {sorted(rest)}")
        spec = self.spec()
        spec = dataclasses.replace(
            spec,
            optim=dataclasses.replace(spec.optim, **optim),
            micro_batch=dataclasses.replace(spec.micro_batch, **micro),
        )
        return self.component.load()(p, spec)

    def _close(self, a: Any, b: Any, what: str, atol: float) -> None:
        import torch

        a, b = a.detach().float().cpu(), b.detach().float().cpu()
        assert a.shape == b.shape, f"{what}: shapes {tuple(a.shape)} vs {tuple(b.shape)}"
        err = float((a - b).abs().max()) if a.numel() else 0.0
        assert torch.allclose(a, b, atol=atol, rtol=0), f"{what}: max abs diff {err:.3g} > {atol}"

    def default_backend(self) -> Any:
        return self.make()

    def test_log_probs_match_reference_forward(self) -> None:
        self.require()
        batch = _random_batch(0)
        b = self.make()
        try:
            lp, ent = b.compute_log_probs(batch, with_entropy=True)
        finally:
            b.shutdown()
        self._close(
            lp,
            reference_batch_log_probs(_load_reference(self.model_dir()), batch, 0.9),
            "log-probs",
            self.lp_atol,
        )
        assert ent is not None and ent.shape == lp.shape

    def test_export_weights_round_trips_into_a_fresh_hf_model(self) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        self.require()
        batch = _random_batch(1)
        b = self.make()
        try:
            b.update_policy(batch, TokenMeanObjective(batch))
            lp, _ = b.compute_log_probs(batch)
            exported = {k: v.detach().float().cpu().clone() for k, v in b.export_weights()}
        finally:
            b.shutdown()
        fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(self.model_dir()))).float()
        missing, unexpected = fresh.load_state_dict(exported, strict=False)
        assert not unexpected, f"export_weights yields names the HF model does not have: {unexpected[:5]}"
        assert not [m for m in missing if "rotary" not in m], f"export_weights misses {missing[:5]}"
        before = _load_reference(self.model_dir()).state_dict()
        assert any(not torch.equal(exported[k], before[k].float()) for k in exported), (
            "the update changed nothing"
        )
        self._close(
            reference_batch_log_probs(fresh.eval(), batch, 0.9),
            lp,
            "log-probs of the exported weights",
            self.lp_atol,
        )

    def test_non_finite_gradients_skip_the_step(self) -> None:
        """A NaN loss is reported as a skipped step and leaves the weights as they were."""
        self.require()
        batch = _random_batch(5)
        b = self.make()
        try:
            before, _ = b.compute_log_probs(batch)
            m = b.update_policy(batch, NonFiniteObjective(batch))
            after, _ = b.compute_log_probs(batch)
        finally:
            b.shutdown()
        assert m["actor/skipped_steps"] == 1.0, m
        self._close(after, before, "log-probs after a skipped (NaN) step", 0.0)

    def test_an_update_counts_its_steps_and_reports_the_step_metrics(self) -> None:
        """``version`` counts the actor steps taken, a skipped one not; every update reports the train
        kit's step metrics (``rlzoo.train_kit.update.step_metrics``) at the schedule's LR."""
        self.require()
        batch = _random_batch(4)
        b = self.make()
        try:
            taken = b.update_policy(batch, TokenMeanObjective(batch))
            after_taken = b.version
            skipped = b.update_policy(batch, NonFiniteObjective(batch))
            after_skipped = b.version
        finally:
            b.shutdown()
        keys = {"loss", "grad_norm", "lr", "skipped_steps", "num_micro_batches"}
        for m in (taken, skipped):
            assert {f"actor/{k}" for k in keys} <= set(m), m
        assert (taken["actor/skipped_steps"], skipped["actor/skipped_steps"]) == (0.0, 1.0)
        assert (after_taken, after_skipped) == (1, 1)
        assert taken["actor/num_micro_batches"] >= 1

    def test_checkpoint_save_load_next_update_identical(self) -> None:
        self.require()
        b1, b2 = _random_batch(2), _random_batch(3)
        path = self._tmp / "ckpt"
        a = self.make()
        try:
            a.update_policy(b1, TokenMeanObjective(b1))
            a.save_checkpoint(path, {"step": 1})
            a.update_policy(b2, TokenMeanObjective(b2))
            want, _ = a.compute_log_probs(b2)
            want_version = a.version
        finally:
            a.shutdown()
        c = self.make()
        try:
            assert c.load_checkpoint(path) == {"step": 1}
            c.update_policy(b2, TokenMeanObjective(b2))
            got, _ = c.compute_log_probs(b2)
            assert c.version == want_version
        finally:
            c.shutdown()
        self._close(got, want, "log-probs after save → load → update", self.update_atol)

    def test_grad_accumulation_invariance(self) -> None:
        self.require()
        batch = _random_batch(4, B=6)
        out = []
        for mbs in (6, 1):
            b = self.make(**{self.micro_batch_field: mbs})
            try:
                b.update_policy(batch, TokenMeanObjective(batch))
                out.append(b.compute_log_probs(batch)[0])
            finally:
                b.shutdown()
        self._close(out[1], out[0], "log-probs after one update, 6×1 vs 1×6 micro-batches", self.update_atol)
