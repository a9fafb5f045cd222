#!/usr/bin/env bash
# Fixture in verl's syntax modelled on verl's examples/grpo_trainer/run_qwen2-7b_math_trtllm.sh and
# run_gptoss_20b.sh (GRPO on GSM8K + MATH), written for rlzoo's tests: a for loop that clears the
# scheduler's variables, a for loop that builds the file lists, a helper written from a
# here-document, the tensor-parallel size from the first argument, "${@:2}" for the rest, and
# text after the launch that bash never reaches (an unclosed quote).
set -xeuo pipefail

# scheduler / MPI variables inherited from a job would confuse Ray: drop them
for v in $(env | awk -F= '/^(SLURM|PMI|PMIX|OMPI)_/{print $1}'); do
    unset "$v"
done

# a helper the launch does not read; the body is data (quotes and $ are not the shell's here)
cat > /tmp/grpo_check_data.py <<'EOF'
import pyarrow.parquet as pq
print("it's only checked: $HOME is not expanded in a quoted here-document")
EOF

TP=${1:-2}
DATA_ROOT=${DATA_ROOT:-"$HOME/data"}
TRAIN_FILES=()
TEST_FILES=()
for dataset in gsm8k math; do
    TRAIN_FILES+=("'$DATA_ROOT/$dataset/train.parquet'")
    TEST_FILES+=("'$DATA_ROOT/$dataset/test.parquet'")
done
join() { local IFS=,; echo "$*"; }   # defined, never called: a function body is read, not run
EXP=qwen2-7b-tp${TP}

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="[${TRAIN_FILES[0]},${TRAIN_FILES[1]}]" \
    data.val_files="[${TEST_FILES[*]:0:1}]" \
    data.train_batch_size=64 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=${TP} \
    actor_rollout_ref.rollout.n=5 \
    trainer.logger='["console"]' \
    trainer.experiment_name=${EXP:0:16} \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.total_epochs=1 \
    "${@:2}"

echo "finished at $(date)   # an unclosed quote: bash runs the launch above before it reads this line
