"""Ulysses sequence parallelism in the fsdp2 backend (CPU, gloo).

The distributed runs are ``tests/backends/fsdp2/ulysses_worker.py`` under torchrun (2 ranks: a GQA
Qwen2, ulysses_size 1 and 2; 4 ranks: an MHA Llama, ulysses_size 1, 2 and 4; each size above 1 also
with activation checkpointing and with eager attention). ``ulysses_size: 1`` (sdpa) is the reference: log-probs, entropies, reference
log-probs, ``sum_pi_squared``, critic values, losses, gradient norms, the gradients handed to the
optimizer and the weights after the step must equal it in fp32.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from rlzoo.backends.fsdp2 import FSDP2Params, ulysses_problems

from ..conftest import torchrun

WORKER = Path(__file__).with_name("ulysses_worker.py")
ATOL = 1e-5
#: the numbers compared (not the per-micro-batch means, e.g. ratio_mean: their micro-batches differ)
NUMBERS = ("actor/loss", "actor/grad_norm", "critic/loss", "critic/grad_norm", "actor/skipped_steps")


# ---------------------------------------------------------------------------------------------
# validation (no process group)
# ---------------------------------------------------------------------------------------------
def test_ulysses_problems_name_both_numbers() -> None:
    assert ulysses_problems(2, 4, heads=(4, 2)) == []
    assert ulysses_problems(3, 4) == ["3 does not divide the world size 4; use a divisor of 4"]
    # 4 heads, 2 KV heads (the tiny Qwen2): 4 divides the heads but not the KV heads
    assert ulysses_problems(4, None, heads=(4, 2), where="model.path") == [
        "4 does not divide the model's 2 KV heads (model.path); use a divisor of 2"
    ]


def test_ulysses_size_range_and_padding_free() -> None:
    with pytest.raises(ValueError, match="ulysses_size"):
        FSDP2Params(ulysses_size=0)
    with pytest.raises(ValueError, match="use_remove_padding: true"):
        FSDP2Params(ulysses_size=2, use_remove_padding=False)
    assert FSDP2Params().ulysses_size == 1


def _cfg(tmp_path: Path, *, placement: str, workers: int, heads: int, kv: int) -> SimpleNamespace:
    (tmp_path / "config.json").write_text(
        json.dumps({"num_attention_heads": heads, "num_key_value_heads": kv})
    )
    pool = SimpleNamespace(nnodes=1, n_gpus_per_node=0, n_workers_per_node=workers)
    return SimpleNamespace(
        placement=SimpleNamespace(name=placement, trainer=pool),
        model=SimpleNamespace(path=str(tmp_path), critic_path=None),
    )


def test_check_refuses_world_and_heads(tmp_path: Path) -> None:
    p = FSDP2Params(ulysses_size=4)
    assert p.check(_cfg(tmp_path, placement="ray", workers=8, heads=8, kv=4)) == []
    problems = p.check(_cfg(tmp_path, placement="ray", workers=6, heads=12, kv=2))
    assert problems == [
        "trainer.backend.ulysses_size: 4 does not divide the world size 6 (the trainer pool "
        "(placement.trainer)); use a divisor of 6",
        "trainer.backend.ulysses_size: 4 does not divide the model's 2 KV heads (model.path); use a divisor of 2",
    ]
    local = p.check(_cfg(tmp_path, placement="local", workers=1, heads=8, kv=8))
    assert local and "world size 1" in local[0]
    assert FSDP2Params().check(_cfg(tmp_path, placement="local", workers=1, heads=3, kv=1)) == []


def test_validate_refuses_bad_ulysses_size() -> None:
    """Through the recipe's binding (what ``rlzoo validate`` runs): 4 Ray trainer workers, size 3."""
    from rlzoo.kernel.errors import ConfigError
    from rlzoo.recipe.config import load_config

    overrides = ["trainer.backend=fsdp2", "placement.name=ray", "placement.trainer.n_workers_per_node=4"]
    with pytest.raises(ConfigError, match="ulysses_size: 3 does not divide the world size 4"):
        load_config("quickstart", [*overrides, "trainer.backend.ulysses_size=3"])
    cfg = load_config("quickstart", [*overrides, "trainer.backend.ulysses_size=2"])
    assert cfg.trainer.backend.params.ulysses_size == 2


# ---------------------------------------------------------------------------------------------
# equality with ulysses_size 1
# ---------------------------------------------------------------------------------------------
def _run(tmp: Path, nproc: int, sizes: list[int]) -> Path:
    torchrun(str(WORKER), "equality", str(tmp), *map(str, sizes), timeout=540, nproc=nproc)
    return tmp


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("ulysses2"), 2, [1, 2])


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("ulysses4"), 4, [1, 2, 4])


def _assert_equal_runs(out: Path, tag: str) -> None:
    ref, got = load_file(str(out / "u1.safetensors")), load_file(str(out / f"{tag}.safetensors"))
    assert set(got) == set(ref)
    assert any(k.startswith("grad/critic/backbone") and ref[k].abs().max() > 0 for k in ref)
    for name in ref:  # outputs, gradients (grad/...) and weights after the step (w/...)
        torch.testing.assert_close(got[name], ref[name], atol=ATOL, rtol=0, msg=f"{tag}: {name}")
    n_ref = json.loads((out / "u1.json").read_text())
    n_got = json.loads((out / f"{tag}.json").read_text())
    for step in n_ref:
        for key in NUMBERS:
            if key in n_ref[step]:
                assert n_got[step][key] == pytest.approx(n_ref[step][key], abs=ATOL, rel=1e-5), (step, key)


@pytest.mark.distributed
@pytest.mark.slow  # one torchrun of ~40 s for the three
@pytest.mark.parametrize("tag", ["u2", "u2_ckpt", "u2_eager"])
def test_two_ranks_equal_ulysses_1(two_ranks: Path, tag: str) -> None:
    _assert_equal_runs(two_ranks, tag)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("tag", ["u2", "u2_ckpt", "u2_eager", "u4", "u4_ckpt", "u4_eager"])
def test_four_ranks_equal_ulysses_1(four_ranks: Path, tag: str) -> None:
    _assert_equal_runs(four_ranks, tag)


# ---------------------------------------------------------------------------------------------
# memory of a long sequence
# ---------------------------------------------------------------------------------------------
@pytest.mark.distributed
@pytest.mark.slow
def test_long_sequence_activations_split(tmp_path: Path) -> None:
    """4096 tokens, hidden 256: each rank keeps well under the unsplit run's activations with SP 2
    (the linear layers see half the tokens; attention keeps its N x N mask on every rank)."""
    peak = {}
    for size in (1, 2):
        torchrun(str(WORKER), "memory", str(tmp_path), str(size), timeout=540, nproc=2)
        result = json.loads((tmp_path / f"memory_u{size}.json").read_text())
        peak[size] = max(r["saved_bytes"] for r in result["ranks"])
    assert peak[2] < 0.75 * peak[1], peak
