#!/usr/bin/env bash
# The vllm backend's engine-side tests against the real vLLM 0.32.0 on CPU torch (no GPU needed).
#
#   scripts/check-vllm-cpu.sh [VENV_DIR]        # default: /tmp/rlzoo-vllm-venv (reused if present)
#
# Builds a separate venv (vLLM pins transformers <5.20 and brings CUDA wheels the dev venv should
# not get): CPU torch 2.13.0 first, then vllm==0.32.0 under constraints.txt (torch stays put), then
# removes vLLM's CUDA-built torchvision / torchaudio / torchcodec (they fail to load without CUDA
# and `import vllm` pulls them in), installs rlzoo (no deps) + what its tests import, and runs
# tests/backends/test_vllm_real.py with vLLM's CPU platform (VLLM_TARGET_DEVICE=cpu). Prints the
# time of each phase. Measured on a 2-core CI-like box: see docs/backends/vllm.md.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-/tmp/rlzoo-vllm-venv}"
PIP_FLAGS=(-q -c "$ROOT/constraints.txt")
t0=$(date +%s)
phase() { echo "[check-vllm-cpu] $1: $(( $(date +%s) - t0 ))s since start"; }

if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install "${PIP_FLAGS[@]}" "torch==2.13.0"
  phase "torch installed"
  "$VENV/bin/pip" install "${PIP_FLAGS[@]}" "vllm==0.32.0"
  phase "vllm installed"
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  "$VENV/bin/pip" install "${PIP_FLAGS[@]}" --no-deps -e "$ROOT"
  "$VENV/bin/pip" install "${PIP_FLAGS[@]}" pluggy hydra-core omegaconf pytest pytest-timeout
  phase "venv ready"
fi
"$VENV/bin/python" -c "import torch, vllm; print('[check-vllm-cpu] torch', torch.__version__, 'vllm', vllm.__version__)"
du -sh "$VENV" | sed 's/^/[check-vllm-cpu] venv size: /'
cd "$ROOT"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs tests/backends/test_vllm_real.py \
  tests/backends/test_vllm_logic.py
phase "tests done"
