"""What every rollout backend shares: the finished-sample stream."""
