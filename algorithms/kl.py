"""Built-in kl parts (being written)."""
