"""Built-in runners (being written)."""
