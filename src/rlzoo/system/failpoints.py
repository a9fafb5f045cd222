"""Named points where a process can be made to die by kill -9, for fault-injection tests.

``RLZOO_KILL_AT=NAME@K`` (e.g. ``save:manifest@3``): the K-th time this process passes the point
``NAME`` it sends itself SIGKILL, exactly as an out-of-memory kill or a pulled plug would stop it
there. ``RLZOO_DISK_FULL_AT=NAME@K``: from the K-th pass on, every write that grows a file fails as
on a disk that just filled up (the process's file-size limit drops to 0, ``RLIMIT_FSIZE``: the OS
refuses with ``EFBIG``, "File too large", where a full disk says ``ENOSPC``). Unset (always, outside
such tests) a point costs one dictionary lookup. The points:

==================  ===========================================================================
``save:begin``      a checkpoint is about to be written (nothing of it on disk yet)
``save:staged``     a checkpoint's files are written to ``step_K.partial/``, no manifest yet
``save:manifest``   its manifest is written, not yet renamed to ``step_K/``
``save:committed``  ``step_K/`` is in place, ``latest`` not yet updated, the step's row not yet written
``export:written``  the train backend wrote the HF folder into the staging folder
``export:installed``  ``final/`` (or ``export/step_K/``) was replaced, the step's checkpoint not yet written
``samples:staged``  a step's samples file is written under its temporary name, not yet renamed
``metrics:before``  a step's metrics row is about to be written
``metrics:after``   a step's metrics row is written
``resume:loaded``   a resume loaded its checkpoint; nothing in the run directory changed yet
``resume:branched``  the checkpoints after it moved aside
``resume:rewound``  the metrics rows after it moved aside
``resume:recorded``  the resume is appended to ``resumes.yaml``
==================  ===========================================================================
"""

from __future__ import annotations

import os
import signal

_ENV = "RLZOO_KILL_AT"
_DISK_FULL_ENV = "RLZOO_DISK_FULL_AT"
_hits: dict[tuple[str, str], int] = {}


def failpoint(name: str) -> None:
    """Die here by SIGKILL when ``RLZOO_KILL_AT`` names this point and hit; from here on, fail
    every write that grows a file when ``RLZOO_DISK_FULL_AT`` does."""
    if _due(_ENV, name):
        os.kill(os.getpid(), signal.SIGKILL)
    if _due(_DISK_FULL_ENV, name):
        _fill_the_disk()


def _due(env: str, name: str) -> bool:
    spec = os.environ.get(env)
    if not spec:
        return False
    target, _, at = spec.partition("@")
    if target != name:
        return False
    key = (env, name)
    _hits[key] = _hits.get(key, 0) + 1
    return _hits[key] == int(at or 1)


def _fill_the_disk() -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, it does not kill
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
