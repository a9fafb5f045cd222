"""Built-in dataset preparers (being written)."""
