"""Built-in policy_loss parts (being written)."""
