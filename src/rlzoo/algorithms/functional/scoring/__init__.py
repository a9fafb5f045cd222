"""Scorer implementations (imported lazily by :mod:`rlzoo.algorithms.scorers`).

Each module holds one convention:

- :mod:`.extract`: answer extraction shared by all (last ``\\boxed{}``, ``Answer:`` lines, numbers)
- :mod:`.math_answer`: ``math`` (math-verify)
- :mod:`.gsm8k`: ``gsm8k`` (verl's ``####`` convention)
- :mod:`.geo3k`: ``geo3k`` (accuracy + ``<think>`` format)
- :mod:`.dapo_math`: ``dapo_math`` (verl's math_dapo, Minerva normalisation) and ``aime``
- :mod:`.dispatch`: ``auto`` (choose by data source, like verl's default_compute_score)
"""
