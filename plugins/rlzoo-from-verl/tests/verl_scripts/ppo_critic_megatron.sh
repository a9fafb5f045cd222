# Fixture in verl's syntax modelled on verl's examples/ppo_trainer megatron scripts (PPO with a
# critic, Megatron TP/PP), written for rlzoo's tests: --config-name, if/elif/else on a variable.
set -x
ENGINE=${1:-vllm}
SIZE=${SIZE:-7b}
if [[ "$SIZE" == "7b" ]]; then
    TP=2
    PP=2
elif [[ "$SIZE" == "32b" ]]; then
    TP=4
    PP=4
else
    TP=1
    PP=1
fi

python3 -m verl.trainer.main_ppo --config-path=config \
    --config-name='ppo_megatron_trainer.yaml' \
    algorithm.adv_estimator=gae \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.clip_grad=1.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$TP \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$PP \
    actor_rollout_ref.actor.megatron.use_mbridge=True \
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full \
    actor_rollout_ref.rollout.name=$ENGINE \
    actor_rollout_ref.rollout.tensor_model_parallel_size=$TP \
    actor_rollout_ref.ref.megatron.tensor_model_parallel_size=$TP \
    critic.optim.lr=1e-5 \
    critic.optim.lr_warmup_steps_ratio=0.0 \
    critic.model.path=deepseek-ai/deepseek-llm-7b-chat \
    critic.megatron.tensor_model_parallel_size=$TP \
    critic.ppo_micro_batch_size_per_gpu=4 \
    trainer.critic_warmup=0 \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.total_epochs=15
