"""Built-in advantage parts (being written)."""
