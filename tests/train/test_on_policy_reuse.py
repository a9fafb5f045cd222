"""Exactly on-policy updates skip the old-log-prob forward: same loss, gradients and weights as computing it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from run_fixtures import as_rollout
from transformers import AutoModelForCausalLM

from rlzoo.backends.native.train import NativeTrainBackend
from rlzoo.backends.native.train_params import NativeTrainParams
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.settings import MicroBatchSettings, OptimSettings, TrainSpec
from rlzoo.models.tiny import tiny_qwen2_config
from rlzoo.recipe.config import load_config
from rlzoo.testing.backends import make_train_batch
from rlzoo.train.update import PolicyTrainer, trainer_setup
from rlzoo.train_kit.formulas import offpolicy_metrics

V = 64


def _backend() -> NativeTrainBackend:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_qwen2_config(V)).float()
    # micro-batches of 3 rows: the reused log-probs come from several forwards of one optimizer step
    spec = TrainSpec(
        model_path="", optim=OptimSettings(lr=1e-2), micro_batch=MicroBatchSettings(size=3, log_prob_size=3)
    )
    return NativeTrainBackend.from_module(model, NativeTrainParams(device="cpu"), spec)


def _batch(be: NativeTrainBackend) -> Batch:
    g = torch.Generator().manual_seed(1)
    prompts = [
        [int(t) for t in torch.randint(2, V, (int(n),), generator=g)]
        for n in torch.randint(1, 6, (8,), generator=g)
    ]
    responses = [
        [int(t) for t in torch.randint(2, V, (int(n),), generator=g)]
        for n in torch.randint(1, 7, (8,), generator=g)
    ]
    b = make_train_batch(prompts, responses, seed=1)
    mask = b["response_mask"]
    lp, _ = be.compute_log_probs(b)
    scores = torch.zeros_like(mask)
    last = mask.sum(-1).long() - 1  # [B]
    scores[torch.arange(8), last] = torch.randint(0, 2, (8,), generator=g).float()
    return as_rollout(b, lp, scores, g)


def _trainer(tmp_path: Path, reuse: bool, *extra: str) -> tuple[PolicyTrainer, NativeTrainBackend]:
    cfg = load_config(
        "quickstart",
        [f"data.dir={tmp_path}", "rollout.n=4", "algorithm.entropy_coeff=0.01", *extra],
    )
    be = _backend()
    tr = trainer_setup(cfg).build(be, offpolicy_metrics=offpolicy_metrics)
    tr.settings = dataclasses.replace(tr.settings, reuse_on_policy_log_probs=reuse)
    return tr, be


def _grads_after_step(be: NativeTrainBackend) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in be.actor.state_dict().items()}


def test_skipped_forward_gives_the_same_update(tmp_path: Path) -> None:
    one_mb = ("trainer.ppo_mini_batch_size=2", "trainer.ppo_epochs=1")  # 2 prompts x 4 = the whole batch
    results = {}
    for reuse in (False, True):
        tr, be = _trainer(tmp_path, reuse, *one_mb)
        batch = _batch(be)
        counted = _Counting(be)
        tr.backend = counted
        m = tr.step(batch, timer=lambda name: _Null())
        results[reuse] = (m, _grads_after_step(be), counted.calls)
    (m0, w0, n0), (m1, w1, n1) = results[False], results[True]
    assert (n0, n1) == (1, 0)  # the skipped path ran no old-log-prob forward
    assert m0["actor/old_log_prob_skipped"] == 0.0 and m1["actor/old_log_prob_skipped"] == 1.0
    for k in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/pg_clipfrac"):
        assert m1[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-7), k
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], rtol=1e-5, atol=1e-7, msg=k)
    # the rollout-vs-trainer drift is still reported (measured on the update's forward)
    drift0, drift1 = (float(m["rollout_corr/log_ppl_abs_diff"]) for m in (m0, m1))
    assert drift1 == pytest.approx(drift0, rel=0.2) and drift1 > 0  # a mean over micro-batches


def test_reused_drift_is_measured_over_the_whole_batch(tmp_path: Path) -> None:
    # micro-batches of 3, 3 and 2 rows: the drift of an exactly on-policy update is measured once
    # over all of them, so it equals the separate forward's (whole-batch) drift, maxima included
    one_mb = ("trainer.ppo_mini_batch_size=2", "trainer.ppo_epochs=1")
    ms = []
    for reuse in (False, True):
        tr, be = _trainer(tmp_path, reuse, *one_mb)
        ms.append(tr.step(_batch(be), timer=lambda name: _Null()))
    keys = sorted(k for k in ms[0] if k.startswith("rollout_corr/"))
    assert len(keys) == 16 and keys == sorted(k for k in ms[1] if k.startswith("rollout_corr/"))
    for k in keys:
        assert float(ms[1][k]) == pytest.approx(float(ms[0][k]), rel=1e-4, abs=1e-6), k


@pytest.mark.parametrize(
    "extra",
    [
        ("trainer.ppo_mini_batch_size=1",),  # two mini-batches: the second is off-policy
        ("trainer.ppo_mini_batch_size=2", "trainer.ppo_epochs=2"),
        ("trainer.ppo_mini_batch_size=2", "algorithm.rollout_correction=token_is"),
    ],
)
def test_not_skipped_when_not_exactly_on_policy(tmp_path: Path, extra: tuple[str, ...]) -> None:
    tr, be = _trainer(tmp_path, True, *extra)
    assert not tr.reuses_log_probs(_batch(be))


class _Counting:
    """The backend, counting compute_log_probs calls."""

    def __init__(self, be: NativeTrainBackend) -> None:
        self.be, self.calls = be, 0

    def compute_log_probs(self, *a: object, **k: object) -> object:
        self.calls += 1
        return self.be.compute_log_probs(*a, **k)

    def __getattr__(self, name: str) -> object:
        return getattr(self.be, name)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None
