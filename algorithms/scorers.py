"""Built-in scorers parts (being written)."""
