"""Runtime model helpers: tiny models and tokenizers built from configs (no downloads).

:mod:`rlzoo.models.tiny` builds the quickstart's and the tiny recipes' models and word-level
tokenizers; it is runtime code (the quickstart and the benchmarks use it), unlike
:mod:`rlzoo.testing`, which holds the pytest-based conformance suites for plugin authors.
"""
