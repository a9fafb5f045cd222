"""sum_pi_squared from the train backends equals a direct softmax over the vocabulary.

The reference is the obvious computation: a full forward over the untrimmed batch, ``softmax`` of
the logits that predict each response token (divided by the temperature) in float64, squared and
summed over the vocabulary, zero on response padding.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from rlzoo.backends.native.train import NativeTrainBackend
from rlzoo.backends.native.train_params import NativeTrainParams
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import SumPiSquaredSource
from rlzoo.kernel.settings import MicroBatchSettings, TrainSpec
from rlzoo.testing.backends import response_logits
from rlzoo.train_kit.logprobs import sum_pi_squared

sys.path.insert(0, str(Path(__file__).parent))
from fsdp2_worker import PARAMS, SETTINGS, sample_batch, tiny_model


def direct_sum_pi_squared(model: torch.nn.Module, batch: Batch, temperature: float) -> torch.Tensor:
    T = batch["responses"].shape[1]
    P = batch["input_ids"].shape[1] - T
    probs = torch.softmax(response_logits(model, batch) / temperature, dim=-1)  # [B, T, V]
    valid = batch["attention_mask"][:, P:].double()  # [B, T]
    return probs.square().sum(-1) * valid  # [B, T]


def test_chunked_formula_equals_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g) * 4  # [B, T, V], peaked rows too
    want = torch.softmax(logits.double() / 0.6, -1).square().sum(-1)  # [B, T]
    for chunk in (1, 3, 1024):
        got = sum_pi_squared(logits, temperature=0.6, chunk_tokens=chunk)
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)
    strided = logits[:, 1:-1]  # a slice, as the trainer passes it
    torch.testing.assert_close(
        sum_pi_squared(strided, chunk_tokens=2).double(),
        torch.softmax(strided.double(), -1).square().sum(-1),
        atol=1e-6,
        rtol=1e-5,
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_native_backend_matches_direct_softmax(temperature: float) -> None:
    model = tiny_model(0)
    spec = TrainSpec(
        model_path="", temperature=temperature, micro_batch=MicroBatchSettings(size=2, log_prob_size=2)
    )
    be = NativeTrainBackend.from_module(model, NativeTrainParams(device="cpu"), spec)
    assert isinstance(be, SumPiSquaredSource)
    batch = sample_batch(3, B=5)
    lp, sps = be.compute_log_probs_and_sum_pi_squared(batch)
    want = direct_sum_pi_squared(be.actor, batch, temperature)
    assert sps.dtype == torch.float32 and sps.shape == batch["responses"].shape
    torch.testing.assert_close(sps.double(), want, atol=1e-6, rtol=1e-5)
    valid = batch["attention_mask"][:, -sps.shape[1] :].bool()
    assert ((sps > 0) == valid).all()  # positive on response tokens, zero on padding
    # the same forward gives exactly the log-probs compute_log_probs gives
    assert torch.equal(lp, be.compute_log_probs(batch)[0])


@pytest.mark.distributed
@pytest.mark.parametrize("remove_padding", [True, False])
def test_fsdp2_one_rank_matches_direct_softmax(remove_padding: bool) -> None:
    import torch.distributed as dist

    from rlzoo.backends.fsdp2 import FSDP2Params
    from rlzoo.backends.fsdp2.train import FSDP2TrainBackend

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    batch = sample_batch(4, B=5)
    spec = TrainSpec(model_path="", temperature=0.7, **SETTINGS)
    be = FSDP2TrainBackend(
        FSDP2Params(**PARAMS, use_remove_padding=remove_padding), spec, model=tiny_model(0)
    )
    try:
        lp, sps = be.compute_log_probs_and_sum_pi_squared(batch)
        torch.testing.assert_close(
            sps.double(), direct_sum_pi_squared(tiny_model(0), batch, 0.7), atol=1e-6, rtol=1e-5
        )
        torch.testing.assert_close(lp, be.compute_log_probs(batch)[0], atol=0, rtol=0)
    finally:
        be.shutdown()
