"""Run untrusted code (what a model wrote, a user's program) where it cannot leave.

One API for every caller (scorers, environments, tools): :class:`rlzoo.sandbox.run.Sandbox`
built from :class:`rlzoo.sandbox.params.SandboxParams` runs a program (Python source or an
argv) and returns an :class:`rlzoo.sandbox.run.Execution`; ``sandbox.map`` and ``await
sandbox.arun(...)`` run many at once through a bounded pool of slots. The protections this machine
allows are found once (:func:`rlzoo.sandbox.probe.protections`), logged when a sandbox is built,
and a sandbox whose params ``require`` one the machine lacks refuses to build. With ``url`` set,
:func:`rlzoo.sandbox.remote.connect` gives the same API over a SandboxFusion server. docs/code.md
says what each protection stops.
"""
