# Fixture in verl's syntax modelled on verl's examples/{cispo,gspo,gmpo,sapo}_trainer scripts,
# written for rlzoo's tests: the loss picked by a variable through a case-free if/elif chain.
set -x
LOSS=${LOSS:-cispo}
if [ "$LOSS" == "cispo" ]; then
    clip_low=10
    clip_high=0.2
    extra="actor_rollout_ref.actor.clip_ratio_c=10.0"
elif [ "$LOSS" == "gspo" ]; then
    clip_low=0.0003
    clip_high=0.0004
    extra="actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"
elif [ "$LOSS" == "geo_mean" ]; then
    clip_low=0.4
    clip_high=0.4
    extra="actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"
else
    clip_low=0.2
    clip_high=0.2
    extra="actor_rollout_ref.actor.tau_pos=1.0 actor_rollout_ref.actor.tau_neg=1.05"
fi

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.actor.policy_loss.loss_mode=$LOSS \
    actor_rollout_ref.actor.clip_ratio_low=$clip_low \
    actor_rollout_ref.actor.clip_ratio_high=$clip_high \
    $extra \
    data.train_files="['$HOME/data/gsm8k/train.parquet']" \
    data.val_files="['$HOME/data/gsm8k/test.parquet']" \
    data.train_batch_size=256 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.rollout.n=5 \
    trainer.n_gpus_per_node=8 \
    trainer.total_epochs=15
