"""Tasks shipped with rlzoo: each task's datasets, scorers, environments and tools, in one home.

A task is ``<task>.py`` (params and registration, import-light) and ``_<task>.py`` (the work), e.g.
:mod:`rlzoo.tasks.tools`: the ``tool_arithmetic`` dataset, scorer and environment and the ``calc``
tool. Algorithms (advantages, losses, KL, corrections, filters, reward managers, generic scorers)
live in :mod:`rlzoo.algorithms`.
"""
