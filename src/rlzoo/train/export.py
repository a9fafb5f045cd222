"""A run's model as a standard Hugging Face folder: ``final/``, ``export/step_K/``, ``rlzoo export``.

The folder loads with nothing but transformers (``AutoModelForCausalLM.from_pretrained(path)``,
``AutoTokenizer.from_pretrained(path)``; ``AutoProcessor`` for a vision-language model)::

    config.json  generation_config.json  model.safetensors (or shards + index)
    tokenizer.json  tokenizer_config.json  chat_template.jinja  special_tokens_map.json ...
    preprocessor_config.json ...      (vision-language models: the processor)

The train backend writes the weights and the model config through its ``export_hf(path)`` method
(:class:`HFExportable`; fsdp2 gathers the shards on rank 0, a collective call). :func:`export_model`
then completes the folder from the run's base model (its ``generation_config.json``), the run's
tokenizer (with its chat template) and processor, checks that it is loadable, and moves it into
place atomically: a crash leaves the previous folder untouched.

:func:`export_checkpoint` does the same from a checkpoint of a finished or interrupted run
(``rlzoo export RUN_DIR [--step N] --out DIR``): it rebuilds the run's train backend from the
run's ``config.yaml`` (locally, in this process), loads the checkpoint into it and exports.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlzoo.kernel.errors import RlzooError
from rlzoo.system.digest import file_digest
from rlzoo.system.failpoints import failpoint
from rlzoo.system.storage import StorageError, disk_refusal

__all__ = [
    "HFExportable",
    "copy_export",
    "export_checkpoint",
    "export_model",
    "export_step",
    "final_dir",
    "load_run_config",
    "step_dir",
    "writable_export_dir",
]

logger = logging.getLogger("rlzoo")

#: written by the backends' atomic directories; not part of an HF folder
_MARKERS = ("COMPLETE",)
#: in every exported folder: which files the export wrote, each with its digest
#: (:func:`rlzoo.system.digest.file_digest`), so a later export replaces exactly them, unedited
EXPORT_MARKER = "rlzoo_export.json"
#: in a folder an export is being built in
_STAGING_NOTE = ".rlzoo-staging"


@runtime_checkable
class HFExportable(Protocol):
    """A train backend that can write its actor as an HF folder (weights + config)."""

    def export_hf(self, path: str | Path) -> None:
        """Write ``save_pretrained`` output of the actor (safetensors + config.json) to ``path``.

        Collective on a multi-process backend: every rank calls it, one writes.
        """
        ...


def final_dir(run_dir: str | Path) -> Path:
    """Where a run's final model goes: ``RUN_DIR/final``."""
    return Path(run_dir) / "final"


def step_dir(run_dir: str | Path, step: int) -> Path:
    """Where ``run.export_every`` exports go: ``RUN_DIR/export/step_K``."""
    return Path(run_dir) / "export" / f"step_{int(step)}"


def export_model(
    train_backend: Any,
    src_model_dir: str | Path | None,
    out_dir: str | Path,
    *,
    tokenizer: Any = None,
    processor: Any = None,
    step: int | None = None,
) -> Path:
    """Write ``train_backend``'s actor to ``out_dir`` as a standard HF folder; returns ``out_dir``.

    ``src_model_dir``: the run's base model folder (``model.path``); its ``generation_config.json``
    is carried over (the trained weights change, how to generate does not). ``tokenizer``: the
    run's tokenizer (saved with its chat template; default: what the backend saved, else the base
    model's). ``processor``: a vision-language model's processor (saved too). ``step``: the
    training step it holds (recorded in ``rlzoo_export.json``).

    ``out_dir`` must be new, empty, or an earlier export (:func:`writable_export_dir`); an earlier
    export is replaced only once the new folder is complete. Nothing else is ever deleted.
    """
    if not isinstance(train_backend, HFExportable):
        raise RlzooError(
            f"the train backend {type(train_backend).__name__} cannot export an HF folder: it has no "
            "export_hf(path) method (rlzoo.train.export.HFExportable); the native, fsdp2 and megatron backends have one"
        )
    out = writable_export_dir(out_dir)
    staging: Path | None = None
    try:
        staging = _staging(out)
        _build_and_install(train_backend, src_model_dir, out, staging, tokenizer, processor, step)
    except Exception as exc:
        refused = disk_refusal(exc)
        if refused is None:
            raise
        kept = "the earlier export there is unchanged" if out.exists() else "nothing was written there"
        raise StorageError(
            f"could not write the model folder {out}: {os.strerror(refused[0])}; {kept}. Free some space, "
            "then run the command again (a run: resume it, the export is redone)"
        ) from exc
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)  # a fresh folder of ours (see _staging)
    return out


def _build_and_install(
    train_backend: Any,
    src_model_dir: str | Path | None,
    out: Path,
    staging: Path,
    tokenizer: Any,
    processor: Any,
    step: int | None,
) -> None:
    """:func:`export_model`'s work: the folder built in ``staging/model``, then moved to ``out``."""
    model = staging / "model"
    train_backend.export_hf(model)
    if not model.is_dir():  # a multi-process backend whose rank 0 lives elsewhere wrote nothing here
        raise RlzooError(
            f"export: the train backend wrote nothing to {model} (is it on a shared filesystem?)"
        )
    _complete(model, Path(src_model_dir).expanduser() if src_model_dir else None, tokenizer, processor)
    check_hf_folder(model)
    note = _auto_tokenizer_note(model, tokenizer)
    failpoint("export:written")
    _install(staging, out, step, note)
    failpoint("export:installed")


def copy_export(folder: str | Path, out_dir: str | Path, *, step: int | None = None) -> Path:
    """Copy an exported folder to ``out_dir`` under the same rules as :func:`export_model`."""
    out = writable_export_dir(out_dir)
    staging = _staging(out)
    try:
        shutil.copytree(folder, staging / "model", ignore=shutil.ignore_patterns(EXPORT_MARKER))
        _install(staging, out, step, _marker(Path(folder)).get("tokenizer"))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------
# where an export may write: a new or empty folder, or one rlzoo exported before
# ---------------------------------------------------------------------------------------------
def _files_under(folder: Path) -> list[str]:
    return sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if not f.is_dir())


def writable_export_dir(out_dir: str | Path) -> Path:
    """``out_dir`` resolved, or :class:`RlzooError` when an export there could destroy something.

    An export writes only into a folder that does not exist, an empty one, or one an earlier
    export wrote (its ``rlzoo_export.json`` lists every file in it with its digest, nothing else is
    there, and no file was changed since: rlzoo never overwrites a file it did not write).
    """
    out = Path(out_dir).expanduser().resolve()
    if out == Path.cwd().resolve() or out == out.parent:
        raise RlzooError(
            f"export: --out {out_dir} is the current directory (or /); name a new folder, e.g. --out my-model"
        )
    if not out.exists():
        return out
    if not out.is_dir():
        raise RlzooError(f"export: {out} is a file; name a new folder for the model")
    have = _files_under(out)
    if not have:
        return out
    marker = out / EXPORT_MARKER
    written: dict[str, Any] = {}
    if marker.is_file():
        try:
            files = json.loads(marker.read_text()).get("files", {})
            written = dict(files) if isinstance(files, dict) else {}
        except (OSError, ValueError, AttributeError):
            written = {}
    foreign = [f for f in have if f != EXPORT_MARKER and f not in written]
    if marker.is_file() and not written:
        foreign.insert(0, EXPORT_MARKER)
    if foreign:
        raise RlzooError(
            f"export: {out} already holds files rlzoo did not export there ({_shown(foreign)}); an export "
            "writes only into a new or empty folder, or replaces one it exported before. Choose another folder"
        )
    edited = [f for f in have if f in written and file_digest(out / f) != written[f]]
    if edited:
        raise RlzooError(
            f"export: {out} holds files changed since rlzoo exported them ({_shown(edited)}); rlzoo never "
            "overwrites a file it did not write. Move the folder (or your edits) elsewhere, or choose another "
            "folder"
        )
    return out


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _staging(out: Path) -> Path:
    """A new folder next to ``out`` to build the export in (``.NAME.rlzoo-export-XXXX``).

    Leftovers of earlier exports killed midway (same prefix, holding our ``.rlzoo-staging`` note)
    are removed first; nothing else is touched.
    """
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{out.name}.rlzoo-export-"
    for old in out.parent.glob(prefix + "*"):
        if old.is_dir() and (old / _STAGING_NOTE).is_file():
            shutil.rmtree(old, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    try:
        (staging / _STAGING_NOTE).write_text(f"an rlzoo export in progress into {out}\n")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # just made, ours
        raise
    return staging


def _install(staging: Path, out: Path, step: int | None, tokenizer_note: str | None = None) -> None:
    """Move ``staging/model`` to ``out`` atomically; a previous export there is replaced."""
    model = staging / "model"
    files = _files_under(model)
    for f in files:  # an HF folder others read: weights and configs readable as the umask allows
        os.chmod(model / f, 0o666 & ~_umask())
    digests = {f: file_digest(model / f) for f in files}
    record: dict[str, Any] = {"written_by": "rlzoo export", "step": step, "files": digests}
    if tokenizer_note:
        record["tokenizer"] = tokenizer_note
    (model / EXPORT_MARKER).write_text(json.dumps(record, indent=1) + "\n")
    writable_export_dir(out)  # nothing of the user's arrived meanwhile
    if out.exists():
        out.rename(staging / "previous")  # the previous export (ours) or an empty folder
    model.rename(out)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _marker(folder: Path) -> dict[str, Any]:
    try:
        record = json.loads((folder / EXPORT_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def export_step(folder: str | Path) -> int | None:
    """The step an exported folder holds (from its ``rlzoo_export.json``); None when unknown."""
    step = _marker(Path(folder)).get("step")
    return int(step) if isinstance(step, int) else None


def _auto_tokenizer_note(folder: Path, tokenizer: Any) -> str | None:
    """A warning (logged, and kept in ``rlzoo_export.json``) when plain ``AutoTokenizer`` would
    tokenize differently from the run's tokenizer; None when it agrees (every real model's).

    transformers 5 picks some model types' own tokenizer class over the one the folder declares
    (:mod:`rlzoo.data.tokenizer`): a word-level tokenizer next to a Qwen2 config then loses words.
    """
    if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return None
    try:
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(str(folder))
        special = set(getattr(tokenizer, "all_special_tokens", []) or [])
        words = [t for t in sorted(tokenizer.get_vocab()) if t not in special and t.isprintable()][:200]
        probe = " ".join(words)
        same = auto(probe)["input_ids"] == tokenizer(probe)["input_ids"]
    except Exception as exc:  # a check, never the reason an export fails
        logger.warning("export: could not compare AutoTokenizer with the run's tokenizer (%s)", exc)
        return None
    if same:
        return None
    note = (
        f"plain AutoTokenizer loads this folder as {type(auto).__name__}, which tokenizes differently "
        f"from the run's tokenizer ({type(tokenizer).__name__}); load it with "
        "transformers.PreTrainedTokenizerFast.from_pretrained(path) or rlzoo.data.tokenizer.load_tokenizer(path)"
    )
    logger.warning("export %s: %s", folder.name, note)
    print(f"rlzoo: export: {note}", flush=True)
    return note


def _complete(folder: Path, src: Path | None, tokenizer: Any, processor: Any) -> None:
    """Add what ``save_pretrained`` of the model alone leaves out."""
    for m in _MARKERS:
        (folder / m).unlink(missing_ok=True)
    if src is not None and (src / "generation_config.json").is_file():
        shutil.copyfile(src / "generation_config.json", folder / "generation_config.json")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    elif not (folder / "tokenizer_config.json").exists() and src is not None:
        try:
            from rlzoo.data.tokenizer import load_tokenizer

            load_tokenizer(src).save_pretrained(str(folder))
        except Exception as exc:
            logger.warning("export: no tokenizer found next to the base model %s (%s)", src, exc)
    if processor is not None:
        processor.save_pretrained(str(folder))
        image_processor = getattr(processor, "image_processor", None)
        if image_processor is not None and not (folder / "preprocessor_config.json").exists():
            image_processor.save_pretrained(str(folder))  # what AutoImageProcessor reads
        _name_a_transformers_processor(folder, processor)
    if not (folder / "generation_config.json").exists():
        _write_generation_config(folder, tokenizer)


def _name_a_transformers_processor(folder: Path, processor: Any) -> None:
    """Record the processor as the transformers class it derives from (``AutoProcessor`` can build
    that one), not a local subclass such as rlzoo's image-only processor."""
    import transformers

    standard = next(
        (c.__name__ for c in type(processor).__mro__ if getattr(transformers, c.__name__, None) is c),
        None,
    )
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        f = folder / name
        if standard is None or not f.is_file():
            continue
        data = json.loads(f.read_text())
        if data.get("processor_class") not in (None, standard):
            data["processor_class"] = standard
            f.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _write_generation_config(folder: Path, tokenizer: Any) -> None:
    """A generation config from the model config (and the tokenizer's EOS / pad ids)."""
    from transformers import AutoConfig, GenerationConfig

    gen = GenerationConfig.from_model_config(AutoConfig.from_pretrained(str(folder)))
    if tokenizer is not None:
        if gen.eos_token_id is None and tokenizer.eos_token_id is not None:
            gen.eos_token_id = int(tokenizer.eos_token_id)
        if gen.pad_token_id is None and tokenizer.pad_token_id is not None:
            gen.pad_token_id = int(tokenizer.pad_token_id)
    gen.save_pretrained(str(folder))


def check_hf_folder(folder: str | Path) -> None:
    """Raise :class:`RlzooError` unless ``folder`` has a typed config, weights and a tokenizer."""
    folder = Path(folder)
    problems = []
    cfg = folder / "config.json"
    if not cfg.is_file():
        problems.append("config.json is missing")
    elif "model_type" not in json.loads(cfg.read_text()):
        problems.append("config.json has no model_type")
    if not list(folder.glob("*.safetensors")):
        problems.append("no *.safetensors weights")
    if not (folder / "tokenizer_config.json").is_file():
        problems.append("no tokenizer (tokenizer_config.json)")
    if problems:
        raise RlzooError(f"export {folder} is not a loadable HF folder: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------
# from a checkpoint (rlzoo export)
# ---------------------------------------------------------------------------------------------
def _check_step(run_dir: Path, steps: list[int], step: int | None) -> None:
    have = ", ".join(map(str, steps)) or "none"
    if step is not None and step not in steps:
        raise RlzooError(f"{run_dir} has no checkpoint of step {step} (checkpoints of steps: {have})")
    if not steps:
        raise RlzooError(
            f"{run_dir} has no checkpoint under {run_dir / 'checkpoints'} (set trainer.save_freq to write some)"
        )


def load_run_config(run_dir: str | Path) -> Any:
    """The :class:`~rlzoo.recipe.types.RecipeConfig` a run directory's ``config.yaml`` records.

    ``config.yaml`` notes which plugin provided each part (``{name, plugin, **params}``); the
    ``plugin`` notes are dropped before binding (the names are looked up again).
    """
    import yaml

    from rlzoo.recipe.config import load_config, strip_plugin_notes

    return load_config(strip_plugin_notes(yaml.safe_load((Path(run_dir) / "config.yaml").read_text())))


def export_checkpoint(
    run_dir: str | Path, out_dir: str | Path, *, step: int | None = None, adapter: bool = False
) -> Path:
    """Export checkpoint ``step`` (default: the latest) of ``run_dir`` as an HF folder at ``out_dir``.

    Without any checkpoint, a run's ``final/`` is copied when ``step`` is None. The train backend
    named in ``run_dir/config.yaml`` is rebuilt in this process (local placement). A
    ``trainer.lora`` run exports the merged model with its adapter in ``adapter/``; ``adapter``:
    write only that PEFT adapter folder at ``out_dir``.
    """
    run_dir = Path(run_dir).expanduser()
    cfg_file = run_dir / "config.yaml"
    if not cfg_file.is_file():
        hint = (
            " (no such folder)" if not run_dir.exists() else " (is it a run directory? rlzoo train prints it)"
        )
        raise RlzooError(f"{cfg_file} not found{hint}")
    writable_export_dir(out_dir)  # before anything loads
    if adapter:
        return _export_adapter(run_dir, Path(out_dir).expanduser(), step)
    if step is None and not (run_dir / "checkpoints").is_dir() and final_dir(run_dir).is_dir():
        return copy_export(final_dir(run_dir), out_dir, step=export_step(final_dir(run_dir)))
    from rlzoo.train.checkpoint import CheckpointManager
    from rlzoo.train.inputs import expand, load_processor, load_tokenizer, train_spec

    checkpoints = CheckpointManager(run_dir)
    _check_step(run_dir, checkpoints.steps(), step)

    cfg = load_run_config(run_dir)
    tokenizer = load_tokenizer(cfg)
    sel = cfg.trainer.backend
    backend = sel.fn(sel.params, train_spec(cfg, cfg.trainer.total_steps or 1, tokenizer, announce=False))
    try:
        # verified against its manifest; without a step: the newest good one
        state = checkpoints.load(backend, step) or {}
        return export_model(
            backend,
            expand(cfg.model.path),
            out_dir,
            tokenizer=tokenizer,
            processor=load_processor(cfg),
            step=state.get("step"),
        )
    finally:
        shutdown = getattr(backend, "shutdown", None)
        if callable(shutdown):
            shutdown()


def _export_adapter(run_dir: Path, out: Path, step: int | None) -> Path:
    """``export_checkpoint(adapter=True)``: the PEFT ``adapter/`` of a LoRA export, moved to ``out``."""
    if load_run_config(run_dir).trainer.lora is None:
        raise RlzooError(
            f"{run_dir} trained all weights (no trainer.lora): it has no LoRA adapter; export without --adapter"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RlzooError(f"export --adapter: {out} exists and is not an empty folder; choose a new --out")
    # the merged export is built in a fresh folder of ours next to out (marked, like every export's
    # staging: a leftover of a killed export is recognised and removed; nothing else is touched)
    staging = _staging(out)
    try:
        merged = staging / "merged"
        export_checkpoint(run_dir, merged, step=step)
        if not (merged / "adapter" / "adapter_config.json").is_file():
            raise RlzooError(f"export: the train backend wrote no LoRA adapter in {merged / 'adapter'}")
        if out.exists():
            out.rmdir()  # empty (checked above)
        (merged / "adapter").rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
