"""A dataset class and a prompt sampler from Python files the user names (verl's ``data.custom_cls`` and
``data.sampler``), the way the ``python_file`` scorer takes a scoring function.

:class:`UserDatasetSettings` and :class:`UserSamplerSettings` check their file when a recipe is
validated, reading it as text (``ast``): validating runs none of it. :func:`load_class` imports a file
once per process, under a private module name, from that path only (never through ``sys.path``).

verl's contracts (facts read from verl): a dataset class is constructed as
``cls(data_files=..., tokenizer=..., processor=..., config=<the data section>)`` and its items are
dicts; a sampler as ``cls(data_source=<the dataset>, data_config=<the data section>)`` and iterating
it yields the dataset indices of one epoch.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlzoo.kernel.params import param
from rlzoo.system.user_files import keyword_fit, load_from_file, parse_user_file

#: the keywords verl constructs a custom dataset class with (verl/trainer/ppo/utils.py create_rl_dataset)
DATASET_ARGS = ("data_files", "tokenizer", "processor", "config")
#: the keywords verl constructs a custom sampler with (verl's data.sampler, create_rl_sampler)
SAMPLER_ARGS = ("data_source", "data_config")


def check_class(path: str, name: str, args: tuple[str, ...], key: str) -> ast.ClassDef:
    """Refuse, naming what is wrong and what would be right, a file whose class ``name`` cannot be
    constructed with the keywords ``args``; ``key``: the recipe key named in messages. Reads the file
    as text only. Returns the class's definition."""
    if not path:
        raise ValueError(f"{key}.path is required: the Python file that defines your class")
    if not name:
        raise ValueError(f"{key}.name is required: the name of the class in {path!r}")
    tree = parse_user_file(path, f"{key}.path", f"class {name!r}")
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    if not classes:
        found = sorted(n.name for n in tree.body if isinstance(n, ast.ClassDef))
        raise ValueError(
            f"{path!r} defines no top-level class {name!r} (its classes: {found or 'none'}); set {key}.name "
            "to one of them"
        )
    cls = classes[-1]  # the last definition wins, as when the module runs
    inits = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    if not inits:
        if not cls.bases:
            raise ValueError(
                f"class {name} in {path!r} has no __init__ and no base class, so it cannot be constructed "
                f"with {', '.join(args)}; give it __init__(self, {', '.join(args)})"
            )
        return cls  # an inherited constructor: checked when it is constructed
    missing, unmet = keyword_fit(inits[-1].args, list(args), method=True)
    if missing:
        raise ValueError(
            f"{name}.__init__ in {path!r} does not accept the keyword(s) {missing}; verl's call passes "
            f"{', '.join(args)}: add them to its parameters, or **kwargs"
        )
    if unmet:
        raise ValueError(
            f"{name}.__init__ in {path!r} requires {unmet}, which verl's call does not pass; give them "
            "defaults (and put settings in config)"
        )
    return cls


@dataclass(frozen=True)
class UserDatasetSettings:
    """Your own dataset class, in a Python file you name (verl's ``data.custom_cls``).

    Constructed once per split as verl does: ``name(data_files=[...], tokenizer=..., processor=...,
    config=...)``, ``config`` being the data section (an OmegaConf ``DictConfig`` with verl's key names,
    plus ``config`` below). ``len()`` and ``[i]`` give its rows, dicts read as verl's reward path reads
    them: the messages from ``raw_prompt`` or the ``data.prompt_key`` column, the ground truth from
    ``reward_model.ground_truth`` or ``ground_truth``, and ``data_source``, ``ability``, ``extra_info``,
    ``images``. rlzoo renders and tokenizes the messages itself (token tensors in the rows are not
    read); rows that cannot be used are dropped and counted like a parquet file's. Checked when the
    recipe is validated without running the file: it exists and parses, it defines the class at its
    top level, and the class's ``__init__`` accepts those keywords. docs/data.md.
    """

    path: str = param(help="the Python file that defines the dataset class (required)")
    name: str = param(help="the class's name in that file (required)")
    config: dict[str, Any] = param(
        {}, help="extra keys of the config the class is given (verl: the data section's own keys)"
    )

    def __post_init__(self) -> None:
        check_class(self.path, self.name, DATASET_ARGS, "data.custom_cls")


@dataclass(frozen=True)
class UserSamplerSettings:
    """Your own prompt sampler, in a Python file you name (verl's ``data.sampler.class_path`` /
    ``class_name``): it gives the order of the training prompts.

    Constructed once per run as verl does: ``name(data_source=<the training dataset>,
    data_config=<the data section>)``; each epoch, iterating it gives that epoch's dataset indices (a
    ``torch.utils.data.Sampler``). Each epoch's order is kept in the checkpoint, so a resume continues
    it exactly; a sampler with ``state_dict()`` / ``load_state_dict()`` has that state checkpointed too,
    one without is replayed up to the resumed epoch. A curriculum sampler (one that defines
    ``update(batch)``, verl's ``AbstractCurriculumSampler``) is refused: rlzoo does not feed batches
    back to the sampler. Checked when the recipe is validated without running the file. docs/data.md.
    """

    path: str = param(help="the Python file that defines the sampler class (required; verl's class_path)")
    name: str = param(help="the class's name in that file (required; verl's class_name)")
    config: dict[str, Any] = param(
        {}, help="extra keys of the data_config the sampler is given (verl: the data section's own keys)"
    )

    def __post_init__(self) -> None:
        cls = check_class(self.path, self.name, SAMPLER_ARGS, "data.sampler")
        if any(isinstance(n, ast.FunctionDef) and n.name == "update" for n in cls.body) or any(
            isinstance(b, ast.Name) and b.id == "AbstractCurriculumSampler" for b in cls.bases
        ):
            raise ValueError(
                f"class {self.name} in {self.path!r} is a curriculum sampler (it defines update(batch)); "
                "rlzoo does not feed trained batches back to a sampler: give a sampler whose order depends "
                "only on the dataset and its seed, or leave data.sampler out"
            )


def load_class(path: str, name: str) -> Any:
    """The class, importing the file once per process under a private name (from that path only)."""
    cls = load_from_file(path, name, "rlzoo_user_data_")
    if not isinstance(cls, type):
        raise RuntimeError(f"{name!r} in {path} is not a class")
    return cls


def verl_config(section: Mapping[str, Any], extra: Mapping[str, Any]) -> Any:
    """The data section as verl's classes read it: an OmegaConf ``DictConfig`` (``cfg.key`` and
    ``cfg.get(key)``) with verl's names, ``extra`` on top."""
    from omegaconf import OmegaConf

    out = dict(section)
    if "chat_template_kwargs" in out:
        out.setdefault("apply_chat_template_kwargs", out["chat_template_kwargs"])
    out.update(extra)
    return OmegaConf.create(out)


def user_rows(dataset: Any, prompt_key: str) -> list[dict[str, Any]]:
    """A user dataset's rows in rlzoo's schema (``data_source``, ``prompt_key``, ``ground_truth``,
    ``ability``, ``extra_info``, ``images``), read with ``len()`` and ``[i]``."""
    if not hasattr(type(dataset), "__len__") or not hasattr(type(dataset), "__getitem__"):
        raise TypeError(
            f"{type(dataset).__name__} has no __len__ and __getitem__; a dataset class gives len() rows by index"
        )
    rows: list[dict[str, Any]] = []
    for i in range(len(dataset)):
        item = dataset[i]
        if not isinstance(item, Mapping):
            raise TypeError(
                f"{type(dataset).__name__}[{i}] is a {type(item).__name__}; each row must be a dict"
            )
        rm = item.get("reward_model")
        gt = item.get("ground_truth")
        if gt is None and isinstance(rm, Mapping):
            gt = rm.get("ground_truth")
        messages = item.get("raw_prompt")
        if messages is None:
            messages = item.get(prompt_key)
        images = item.get("images")
        rows.append(
            {
                "data_source": item.get("data_source"),
                prompt_key: messages,
                "ground_truth": gt,
                "ability": item.get("ability"),
                "extra_info": item.get("extra_info") if isinstance(item.get("extra_info"), Mapping) else None,
                "images": images if isinstance(images, list) else None,
            }
        )
    return rows
