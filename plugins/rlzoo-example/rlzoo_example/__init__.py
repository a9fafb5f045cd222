"""rlzoo-example: an example third-party rlzoo plugin.

The hook implementations live in :mod:`rlzoo_example.plugin` (the module named by the ``rlzoo``
entry point). The tensor code lives in :mod:`rlzoo_example.advantage`, imported only when the part
is used, so that ``rlzoo components`` never imports torch on this plugin's behalf.
"""

__version__ = "0.1.0"
