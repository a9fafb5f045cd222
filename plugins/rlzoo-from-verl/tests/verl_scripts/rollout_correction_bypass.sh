# Fixture in verl's syntax modelled on verl's examples/rollout_correction scripts, written for
# rlzoo's tests: escaped Hydra quotes (\'...\'), bypass mode, loss_type.
set -xeuo pipefail
rollout_is="token"
rollout_is_threshold=2.0
rollout_rs="token_k1,seq_max_k2"
rollout_rs_threshold="0.6_1.6,2.5"
bypass_mode="true"
loss_type="${LOSS_TYPE:-ppo_clip}"

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.rollout_correction.rollout_is=${rollout_is} \
    algorithm.rollout_correction.rollout_is_threshold=${rollout_is_threshold} \
    algorithm.rollout_correction.rollout_rs=\'${rollout_rs}\' \
    algorithm.rollout_correction.rollout_rs_threshold=\'${rollout_rs_threshold}\' \
    algorithm.rollout_correction.bypass_mode=${bypass_mode} \
    algorithm.rollout_correction.loss_type=${loss_type} \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=128 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    trainer.total_epochs=1
