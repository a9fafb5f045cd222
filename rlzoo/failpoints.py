"""Named points where a process can be made to die by kill -9, for fault-injection tests.

``RLZOO_KILL_AT=NAME@K`` (e.g. ``save:manifest@3``): the K-th time this process passes the point
``NAME`` it sends itself SIGKILL, exactly as an out-of-memory kill or a pulled plug would stop it
there. Unset (always, outside such tests) a point costs one dictionary lookup. The points:

==================  ===========================================================================
``save:staged``     a checkpoint's files are written to ``step_K.partial/``, no manifest yet
``save:manifest``   its manifest is written, not yet renamed to ``step_K/``
``save:committed``  ``step_K/`` is in place, ``latest`` not yet updated, the step's row not yet written
``export:written``  the train backend wrote the HF folder into the staging folder
``export:installed``  ``final/`` (or ``export/step_K/``) was replaced, the step's checkpoint not yet written
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
_hits: dict[str, int] = {}


def failpoint(name: str) -> None:
    """Die here by SIGKILL when ``RLZOO_KILL_AT`` names this point and hit."""
    spec = os.environ.get(_ENV)
    if not spec:
        return
    target, _, at = spec.partition("@")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(at or 1):
        os.kill(os.getpid(), signal.SIGKILL)
