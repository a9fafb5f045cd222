"""Expert and context parallelism of megatron-core 0.16.1 on a gloo group on the CPU (issue 37).

What runs (docs/backends/megatron.md, "Expert and context parallelism"): the MoE layer with the
alltoall and allgather token dispatchers, expert parallelism 2 equal to the unsplit model (loss,
gradients, parameters after an Adam step). What is refused, with megatron-core's own words:
context parallelism in the local spec. Also the ``device: cpu`` stand-ins these need
(:mod:`rlzoo.backends.megatron.cpu`).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from rlzoo.backends.megatron.convert import ModelDims, transformer_config_kwargs
from rlzoo.backends.megatron.cpu import cpu_device, patch_moe

from .conftest import torchrun

HAVE_MCORE = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)
needs_mcore = pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not installed")
pytestmark = pytest.mark.usefixtures("one_thread")

DIMS = ModelDims(
    num_layers=1,
    hidden_size=16,
    ffn_hidden_size=32,
    num_attention_heads=2,
    num_query_groups=2,
    head_dim=8,
    vocab_size=32,
)


class _AllocatesInBackward(torch.autograd.Function):
    """Doubles in backward, into a buffer allocated as megatron's mappings do
    (``device=torch.cuda.current_device()``)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        out = torch.empty(grad.shape, dtype=grad.dtype, device=torch.cuda.current_device())
        return torch.mul(grad, 2.0, out=out)


@pytest.mark.parametrize("how", ["Tensor.backward", "torch.autograd.backward"])
def test_backward_inside_cpu_device_allocates_on_the_cpu(how: str) -> None:
    """Failed before (``RuntimeError: Cannot access accelerator device``): a backward called inside
    ``cpu_device()`` ran with the mode off (a mode is off in its own handler), so megatron's
    backward allocations on ``torch.cuda.current_device()`` went to CUDA. d(sum(3·f(x)))/dx = 6."""
    x = torch.ones(3, requires_grad=True)
    y = torch.ones(3, requires_grad=True)
    with cpu_device():
        loss = (3 * _AllocatesInBackward.apply(x)).sum() + (y * y).sum()
        if how == "Tensor.backward":
            loss.backward(inputs=[x])
        else:
            torch.autograd.backward([loss], grad_tensors=[torch.tensor(1.0)], inputs=x)
    assert torch.equal(x.grad, torch.full((3,), 6.0))
    assert y.grad is None  # only the inputs named get gradients, as torch's own backward


def test_backward_with_a_vector_gradient() -> None:
    """A non-scalar output with its gradient given: d(sum(g * x²))/dx = 2·g·x."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    g = torch.tensor([3.0, 5.0])
    with cpu_device():
        (x * x).backward(g)
    assert torch.equal(x.grad, torch.tensor([6.0, 20.0]))


def test_backward_keeps_retain_graph_semantics() -> None:
    """``retain_graph=True`` lets a second backward through the same graph accumulate (2·x twice)."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with cpu_device():
        loss = (x * x).sum()
        loss.backward(retain_graph=True)
        torch.autograd.backward(loss)
    assert torch.equal(x.grad, torch.tensor([4.0, 8.0]))


def test_patch_moe_sets_only_what_is_missing_and_keeps_cuda_tensors_to_megatron() -> None:
    """No TE: ``te_general_gemm`` becomes None (kept when TE defined it). CPU split sizes become
    numpy as megatron does for CUDA ones; anything else goes to megatron's own function."""
    import types

    calls: list[object] = []

    def own(tensor: object, as_numpy: bool = False, record_stream: bool = False) -> object:
        calls.append(tensor)
        return "megatron's"

    bare = types.SimpleNamespace()
    with_te = types.SimpleNamespace(te_general_gemm="te's")
    dispatcher = types.SimpleNamespace(maybe_move_tensor_to_cpu=own)
    patch_moe(bare, dispatcher)
    patch_moe(with_te, dispatcher)  # twice: wrapped once
    assert bare.te_general_gemm is None and with_te.te_general_gemm == "te's"
    move = dispatcher.maybe_move_tensor_to_cpu
    splits = move(torch.tensor([3, 1]), as_numpy=True)
    assert not torch.is_tensor(splits) and splits.tolist() == [3, 1]
    t = torch.tensor([2])
    assert move(t) is t
    assert move(None) == "megatron's" and calls == [None]


@needs_mcore
def test_context_parallel_is_refused_by_megatrons_local_attention() -> None:
    """megatron-core's local ``DotProductAttention`` asserts ``context_parallel_size == 1``: the
    exact refusal docs/backends/megatron.md quotes (CP needs Transformer Engine's attention)."""
    import megatron.core.transformer.dot_product_attention as dpa
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnMaskType

    config = TransformerConfig(
        **transformer_config_kwargs(
            DIMS, context_parallel_size=2, params_dtype=torch.float32, use_cpu_initialization=True
        )
    )
    with pytest.raises(
        AssertionError, match="Context parallelism is only supported by TEDotProductAttention"
    ):
        dpa.DotProductAttention(config, 1, AttnMaskType.causal, "self")


@needs_mcore
def test_allgather_dispatcher_refuses_variable_sequence_lengths() -> None:
    """Why the MoE runs set ``variable_seq_lengths=False`` (the dense backend sets it True)."""
    from megatron.core.transformer import TransformerConfig

    moe = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_token_dispatcher_type": "allgather"}
    with pytest.raises(ValueError, match="does not support variable sequence length"):
        TransformerConfig(**transformer_config_kwargs(DIMS, **moe))
    assert TransformerConfig(**transformer_config_kwargs(DIMS, **moe, variable_seq_lengths=False))


DIST_MODULE = Path(__file__).with_name("megatron_moe_dist.py")


@pytest.mark.slow  # ~20 s each on 2 cores (two megatron-core startups under torchrun)
@pytest.mark.distributed
@needs_mcore
@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_expert_parallel_2_equals_unsplit_moe(dispatcher: str) -> None:
    """megatron-core's MoE (4 experts, top-2) with EP=2 over 2 gloo ranks: loss, every gradient and
    every parameter after one Adam step equal EP=1 (fp32, 1e-5), with either token dispatcher."""
    out = torchrun(str(DIST_MODULE), dispatcher, timeout=300, what=f"MoE EP=2 vs EP=1 ({dispatcher})")
    found = re.search(rf"MOE {dispatcher} EP2 == EP1 on cpu: .*", out)
    assert found, out[-3000:]
