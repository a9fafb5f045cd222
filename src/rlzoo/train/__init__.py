"""The core's training machinery: one loop that every runner's batch source feeds.

- :mod:`rlzoo.train.loop`: the one training loop and the batch-source contract;
- :mod:`rlzoo.train.session`: everything the loop needs, built once from the recipe read into a
  frozen :class:`~rlzoo.train.inputs.RunInputs` (the edge);
- :mod:`rlzoo.train.update`: the policy update (:class:`~rlzoo.train.update.PolicyTrainer`);
- :mod:`rlzoo.train.inputs`, :mod:`rlzoo.train.batching`, :mod:`rlzoo.train.rewards`: data and
  inputs, requests and collation, scoring;
- :mod:`rlzoo.train.checkpoint`, :mod:`rlzoo.train.rundir`: checkpoints and the run directory.

The batch sources themselves (``sync``, ``one_step_off``, ``fully_async``) are parts, in
:mod:`rlzoo.sources`.
"""
