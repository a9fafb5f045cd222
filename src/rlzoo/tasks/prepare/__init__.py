"""Dataset preparers: one module per dataset, each exposing ``prepare(out_dir, params)``.

A preparer loads its dataset with ``datasets.load_dataset`` (a hub name, or a local folder / file
/ glob with the upstream column layout), turns each row into rlzoo's schema
(:mod:`rlzoo.data.schema`) and writes ``<out_dir>/<split>.parquet``. It returns
``{split: path}``. Their params dataclasses and registration live in :mod:`rlzoo.tasks.datasets`;
the shared loading and writing code is in :mod:`rlzoo.tasks.prepare._common`.
"""
