"""Built-in loss_agg parts (being written)."""
