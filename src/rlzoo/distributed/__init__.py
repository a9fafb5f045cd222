"""Scale-out: Ray placement, worker groups and trainer -> rollout weight sync.

Import-light: nothing here imports Ray or torch until a placement is built. Modules:

- :mod:`rlzoo.distributed.resources`: pools from the ``placement`` section, checked against the cluster;
- :mod:`rlzoo.distributed.ray_placement`: :class:`~rlzoo.distributed.ray_placement.RayPlacement`;
- :mod:`rlzoo.distributed.worker`: :class:`~rlzoo.distributed.worker.BackendWorker`, the Ray actor hosting backends;
- :mod:`rlzoo.distributed.worker_group`: the actor sets and the driver-side backend proxies;
- :mod:`rlzoo.distributed.weight_sync`: the bucketed broadcast over a torch.distributed group.

See ``docs/distributed.md``.
"""
