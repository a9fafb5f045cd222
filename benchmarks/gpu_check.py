"""One prepared GPU check: rollout, fsdp2 and megatron steps and the contract suites on CUDA, one table.

On a GPU machine (one H200: Python 3.12, torch 2.11+cu130, transformers 5.17, no ray / vllm /
megatron, no internet), from the repository root::

    python benchmarks/gpu_check.py --install-wheels shared/gpu-wheels   # once: offline pip install
    python benchmarks/gpu_check.py                                       # <= 8 minutes, prints the table

Prepare the wheels beforehand on a machine with PyPI (cp312 wheels of what the GPU machine lacks:
megatron-core, hydra-core, omegaconf, antlr4 (sdist), math-verify, latex2sympy2_extended, pluggy,
psutil; ~3.5 MiB in all, pinned to the versions of this environment)::

    python benchmarks/gpu_check.py --fetch-wheels shared/gpu-wheels

CPU smoke run (tiny model, every section, CUDA-only checks skip with their reason)::

    python benchmarks/gpu_check.py --device cpu --tiny

Sections (each in its own process, with a time limit; a missing package or GPU prints
``skipped: reason`` instead of failing the run):

- ``rollout``: the native engine on a Qwen2.5-0.5B-shaped Qwen2 with random weights (built from a
  config, nothing downloaded), bf16, ``--prompts`` prompts x ``--new-tokens`` new tokens: tokens/s.
- ``fsdp2``: one FSDP2 ``update_policy`` (bf16 mixed precision, one process) on the same model:
  tokens/s and MFU (``6 N + 12 L H S`` FLOPs per token over ``--peak-tflops``, 989 for H200 bf16 dense).
- ``megatron``: one megatron-core ``update_policy`` (TP=1, bf16, distributed optimizer): tokens/s, MFU.
- ``megatron_parallel``: megatron-core's MoE (4 experts, top-2, alltoall dispatcher) one Adam step,
  expert parallelism 2 against 1 on 2 GPUs (``tests/backends/megatron_moe_dist.py`` with NCCL; on
  one GPU the EP=1 step alone), and whether context parallelism can be built: it needs Transformer
  Engine's attention (docs/backends/megatron.md, "Expert and context parallelism").
- ``contracts``: ``pytest -m gpu`` over ``tests/backends/test_contract.py`` and
  ``tests/backends/test_gpu_contracts.py`` (native rollout / train, fsdp2, megatron on CUDA;
  vllm skips without vLLM): passed / failed / skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("rollout", "fsdp2", "megatron", "megatron_parallel", "contracts")
#: what the GPU machine lacks (module to check → distribution to fetch); fetched pinned to this env
WHEELS = {
    "megatron.core": "megatron-core",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "antlr4": "antlr4-python3-runtime",
    "math_verify": "math-verify",
    "latex2sympy2_extended": "latex2sympy2_extended",
    "pluggy": "pluggy",
    "psutil": "psutil",
}


# ---------------------------------------------------------------------------------------------
# wheels (no internet on the GPU machine)
# ---------------------------------------------------------------------------------------------
def fetch_wheels(dest: Path) -> None:
    """cp312 manylinux wheels (antlr4: its sdist, pure Python) of :data:`WHEELS`, at this env's versions."""
    from importlib.metadata import PackageNotFoundError, version

    dest.mkdir(parents=True, exist_ok=True)
    for dist in WHEELS.values():
        try:
            spec = f"{dist}=={version(dist)}"
        except PackageNotFoundError:
            spec = dist
        binary = ["--no-binary=:all:"] if dist.startswith("antlr4") else ["--only-binary=:all:"]
        plat = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "any")]
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), *binary, spec]
        if binary[0].startswith("--only"):
            cmd += ["--python-version=3.12", *plat]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    total = sum(f.stat().st_size for f in dest.iterdir())
    print(f"{len(list(dest.iterdir()))} files, {total / 2**20:.1f} MiB in {dest}")


def install_wheels(src: Path) -> None:
    """Offline: the wheels in ``src`` (no dependency resolution), then rlzoo itself (editable)."""
    files = sorted(str(f) for f in src.iterdir() if f.suffix in (".whl", ".gz"))
    pip = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(src), "--no-deps"]
    subprocess.run([*pip, "--no-build-isolation", *files], check=True)
    subprocess.run([*pip, "--no-build-isolation", "-e", str(ROOT)], check=True)


# ---------------------------------------------------------------------------------------------
# sections (each runs in a child process: python gpu_check.py --section NAME --out FILE)
# ---------------------------------------------------------------------------------------------
def qwen2_config(tiny: bool) -> Any:
    """The Qwen2.5-0.5B shape (``benchmarks/fsdp2_step.py``), or a tiny one for the smoke run."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fsdp2_step import qwen2_config as shape

    cfg = shape(tiny)
    cfg.eos_token_id = cfg.bos_token_id = None
    cfg.pad_token_id = 0
    return cfg


def _dtype(a: argparse.Namespace) -> Any:
    import torch

    return torch.bfloat16 if a.device == "cuda" else torch.float32


def _sync(a: argparse.Namespace) -> None:
    import torch

    if a.device == "cuda":
        torch.cuda.synchronize()


def _mfu(a: argparse.Namespace, cfg: Any, n_params: int, tokens_per_s: float, seq: int) -> float | None:
    if a.device != "cuda":
        return None
    flops_per_token = 6 * n_params + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq
    return tokens_per_s * flops_per_token / (a.peak_tflops * 1e12)


def section_rollout(a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from rlzoo.backends.native.rollout import NativeRolloutBackend
    from rlzoo.backends.native.rollout_params import NativeRolloutParams
    from rlzoo.kernel.protocols import GenerationRequest, SamplingParams
    from rlzoo.kernel.settings import RolloutSpec

    cfg = qwen2_config(a.tiny)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(device=a.device, dtype=_dtype(a)).eval()
    spec = RolloutSpec(
        model_path="",
        tokenizer_path="",
        device=a.device,
        dtype="bfloat16" if a.device == "cuda" else "float32",
        max_prompt_length=a.prompt_len,
        max_response_length=a.new_tokens,
    )
    backend = NativeRolloutBackend(NativeRolloutParams(max_num_seqs=a.prompts), spec, model=model)
    g = torch.Generator().manual_seed(0)
    reqs = [
        GenerationRequest(
            request_id=f"r{i}",
            prompt_ids=torch.randint(1, cfg.vocab_size, (a.prompt_len,), generator=g).tolist(),
            sampling=SamplingParams(n=1, temperature=1.0, max_new_tokens=a.new_tokens, seed=i),
        )
        for i in range(a.prompts)
    ]
    try:
        backend.generate(reqs[:2])  # warm-up (kernels, allocator)
        _sync(a)
        t0 = time.perf_counter()
        samples = backend.generate(reqs)
        _sync(a)
        secs = time.perf_counter() - t0
    finally:
        backend.shutdown()
    tokens = sum(len(s.response_ids) for s in samples)
    return {
        "result": f"{tokens / secs:,.0f} tokens/s",
        "detail": f"{a.prompts} prompts x {a.new_tokens} new tokens, {secs:.1f} s, {spec.dtype}",
    }


def _train_batch(a: argparse.Namespace, vocab: int, seed: int) -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fsdp2_step import random_batch

    return random_batch(a.batch, a.prompt_len, a.response_len, vocab, seed)


def _time_updates(a: argparse.Namespace, backend: Any, cfg: Any, n_params: int) -> dict[str, Any]:
    """Time ``a.steps`` updates of ``backend`` (after one warm-up), shut it down, and report."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fsdp2_step import TokenMeanPG

    secs, tokens = 0.0, 0
    try:
        for step in range(1 + a.steps):  # the first is warm-up
            b = _train_batch(a, cfg.vocab_size, step)
            _sync(a)
            t0 = time.perf_counter()
            backend.update_policy(b, TokenMeanPG(b))
            _sync(a)
            if step:
                secs += time.perf_counter() - t0
                tokens += int(b["attention_mask"].sum())
    finally:
        backend.shutdown()
    return _train_result(a, cfg, n_params, secs, tokens)


def _train_result(a: argparse.Namespace, cfg: Any, n_params: int, secs: float, tokens: int) -> dict[str, Any]:
    import torch

    tps = tokens / secs
    mfu = _mfu(a, cfg, n_params, tps, a.prompt_len + a.response_len)
    mem = f", peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if a.device == "cuda" else ""
    return {
        "result": f"{tps:,.0f} tokens/s" + (f", MFU {100 * mfu:.1f} %" if mfu is not None else ""),
        "detail": f"{n_params / 1e6:.0f}M params, batch {a.batch} x {a.prompt_len}+{a.response_len}, "
        f"{secs / a.steps:.2f} s/step{mem}",
    }


def section_fsdp2(a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from rlzoo.backends.fsdp2 import FSDP2Params
    from rlzoo.backends.fsdp2.train import FSDP2TrainBackend
    from rlzoo.kernel.settings import MicroBatchSettings, OptimSettings, TrainSpec

    cfg = qwen2_config(a.tiny)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    spec = TrainSpec(
        model_path="",
        total_steps=1 + a.steps,
        optim=OptimSettings(lr=1e-6),
        micro_batch=MicroBatchSettings(max_tokens=16384),
    )
    backend = FSDP2TrainBackend(
        FSDP2Params(device=a.device, mixed_precision=a.device == "cuda", use_remove_padding=True),
        spec,
        model=model,
    )
    return _time_updates(a, backend, cfg, n_params)


def section_megatron(a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        import megatron.core  # noqa: F401
    except ImportError as e:
        return {"skipped": f"megatron-core not installed ({e})"}
    from rlzoo.backends.megatron import MegatronParams
    from rlzoo.backends.megatron.train import MegatronTrainBackend
    from rlzoo.kernel.settings import MicroBatchSettings, OptimSettings, TrainSpec

    cfg = qwen2_config(a.tiny)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(_dtype(a))
    n_params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as d:
        model.save_pretrained(d)  # megatron converts from an HF checkpoint
        del model
        cuda = a.device == "cuda"
        params = MegatronParams(
            device=a.device, dtype="bfloat16" if cuda else "float32", use_distributed_optimizer=cuda
        )
        spec = TrainSpec(
            model_path=d,
            total_steps=1 + a.steps,
            optim=OptimSettings(lr=1e-6),
            micro_batch=MicroBatchSettings(size=max(1, a.batch // 4)),
        )
        return _time_updates(a, backend=MegatronTrainBackend(params, spec), cfg=cfg, n_params=n_params)


def section_megatron_parallel(a: argparse.Namespace) -> dict[str, Any]:
    import importlib.util

    import torch

    try:
        import megatron.core  # noqa: F401
    except ImportError as e:
        return {"skipped": f"megatron-core not installed ({e})"}
    have_te = importlib.util.find_spec("transformer_engine") is not None
    nproc = 2 if a.device == "cpu" else min(2, torch.cuda.device_count())
    worker = ROOT / "tests" / "backends" / "megatron_moe_dist.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    env = {**os.environ, "RLZOO_MOE_DEVICE": a.device, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [*cmd, str(worker), "alltoall"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=a.section_timeout - 10,
    )
    out = proc.stdout + proc.stderr
    found = re.search(r"^MOE .*$", out, re.M)
    ep = found.group(0) if found else "MoE step failed: " + " | ".join(out.strip().splitlines()[-3:])
    if nproc < 2:
        ep += " (EP=2 needs 2 GPUs)"
    cp = (
        "CP: Transformer Engine installed (rlzoo's backend has no CP yet)"
        if have_te
        else "CP: needs Transformer Engine (not installed)"
    )
    return {"result": ep, "detail": cp, "ok": proc.returncode == 0}


def section_contracts(a: argparse.Namespace) -> dict[str, Any]:
    files = ["tests/backends/test_contract.py", "tests/backends/test_gpu_contracts.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rs", *files]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.section_timeout - 10)
    out = proc.stdout + proc.stderr
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", out.splitlines()[-1])}
    reasons = sorted(set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", out)))
    failed = re.findall(r"^FAILED (\S+)", out, re.M)
    return {
        "result": ", ".join(f"{n} {k}" for k, n in counts.items()) or out.splitlines()[-1],
        "detail": ("failed: " + ", ".join(failed) + "; " if failed else "")
        + ("skip reasons: " + "; ".join(reasons) if reasons else ""),
        "ok": proc.returncode == 0,
    }


RUNNERS = {
    "rollout": section_rollout,
    "fsdp2": section_fsdp2,
    "megatron": section_megatron,
    "megatron_parallel": section_megatron_parallel,
    "contracts": section_contracts,
}


def run_section(name: str, a: argparse.Namespace) -> dict[str, Any]:
    """One section in a child process (isolates process groups, CUDA memory and crashes)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    argv = [a for a in sys.argv[1:] if a not in ("--section",)]
    cmd = [sys.executable, __file__, *argv, "--section", name, "--out", str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.section_timeout, env=env)
        res = json.loads(out.read_text()) if out.stat().st_size else {}
        if not res:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            res = {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    except subprocess.TimeoutExpired:
        res = {"error": f"timed out after {a.section_timeout} s"}
    finally:
        out.unlink(missing_ok=True)
    res["seconds"] = time.perf_counter() - t0
    return res


def child(a: argparse.Namespace) -> None:
    """Run one section here; write its result (or why it was skipped / failed) as JSON."""
    try:
        import torch

        if a.device == "cuda" and not torch.cuda.is_available():
            res: dict[str, Any] = {"skipped": "no CUDA GPU (torch.cuda.is_available() is False)"}
        else:
            if a.device == "cpu":
                torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
            res = RUNNERS[a.section](a)
    except ImportError as e:
        res = {"skipped": f"missing package: {e}"}
    except Exception as e:
        res = {"error": f"{type(e).__name__}: {e}"[:300]}
    Path(a.out).write_text(json.dumps(res))


def environment(a: argparse.Namespace) -> str:
    import platform

    try:
        import torch

        dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"
        tv = torch.__version__
    except ImportError:
        dev, tv = "?", "not installed"
    try:
        import transformers

        hv = transformers.__version__
    except ImportError:
        hv = "not installed"
    return f"python {platform.python_version()}, torch {tv}, transformers {hv}, {dev}, --device {a.device}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="a tiny Qwen2 and small batches (smoke run)")
    ap.add_argument("--only", nargs="*", choices=SECTIONS, help="run these sections (default: all)")
    ap.add_argument("--prompts", type=int, default=64, help="rollout: prompts (one sample each)")
    ap.add_argument("--new-tokens", type=int, default=256, help="rollout: new tokens per prompt")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16, help="train: samples per update")
    ap.add_argument("--steps", type=int, default=3, help="train: timed updates (after one warm-up)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200 / H100 SXM: 989)")
    ap.add_argument("--section-timeout", type=int, default=150, help="seconds per section")
    ap.add_argument("--fetch-wheels", type=Path, help="download the cp312 wheels into DIR and exit")
    ap.add_argument("--install-wheels", type=Path, help="pip install the wheels in DIR offline and exit")
    ap.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.fetch_wheels:
        return fetch_wheels(a.fetch_wheels)
    if a.install_wheels:
        return install_wheels(a.install_wheels)
    if a.tiny:
        a.prompts, a.new_tokens = min(a.prompts, 8), min(a.new_tokens, 16)
        a.prompt_len, a.response_len, a.batch, a.steps = 16, 24, min(a.batch, 8), min(a.steps, 2)
    if a.section:
        return child(a)

    print(f"gpu_check: {environment(a)}", flush=True)
    rows = []
    t0 = time.perf_counter()
    for name in a.only or SECTIONS:
        res = run_section(name, a)
        if "skipped" in res:
            status, result, detail = "skipped", "skipped: " + res["skipped"], ""
        elif "error" in res:
            status, result, detail = "FAILED", res["error"], ""
        else:
            status = "ok" if res.get("ok", True) else "FAILED"
            result, detail = res["result"], res.get("detail", "")
        rows.append((name, status, f"{res['seconds']:.0f}", result, detail))
        print(f"  {name}: {status} ({res['seconds']:.0f} s) {result}", flush=True)
    head = ("section", "status", "s", "result", "detail")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(4)]
    line = " | ".join(f"{{:<{w}}}" for w in widths) + " | {}"
    print()
    print(line.format(*head))
    print("-+-".join("-" * w for w in widths) + "-+-" + "-" * 20)
    for r in rows:
        print(line.format(*r))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
