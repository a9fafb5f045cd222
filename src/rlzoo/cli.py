"""The ``rlzoo`` command line.

rlzoo train [RECIPE | recipe=NAME] [key=value ...]   run a recipe (default: quickstart)
rlzoo validate RECIPE [key=value ...]                resolve every name and param; load nothing
rlzoo components [KIND] [--json]                     list registered parts
rlzoo plugins [--all] [--json]                       list plugins, versions, hooks, parts
rlzoo recipes [--json]                               list recipes on the search path
rlzoo prepare NAME [--out DIR] [key=value ...]       prepare a dataset into rlzoo's parquet schema
rlzoo plot RUN_DIR [RUN_DIR ...]                     learning curves (PNG) and a Markdown summary
rlzoo export RUN_DIR [--step N] [--adapter] --out DIR  a checkpoint as a standard HF folder (or LoRA adapter)
rlzoo eval TARGET [TARGET2] [--n K]                 avg@n, pass@k, maj@k of a checkpoint / model, with intervals
rlzoo view RUN_DIR [RUN_DIR ...] [--html FILE]      curves, samples and trajectories in the browser
rlzoo from-verl SCRIPT_OR_ARGS [--out FILE]         a verl launch script as a recipe (plugins/rlzoo-from-verl)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [len(h) for h in header]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r).rstrip() for r in rows]
    return "\n".join(lines)


def _split_recipe(args: Sequence[str], default: str | None) -> tuple[str | None, list[str]]:
    recipe = default
    overrides: list[str] = []
    for i, a in enumerate(args):
        if a.startswith("recipe="):
            recipe = a.split("=", 1)[1]
        elif i == 0 and "=" not in a and not a.startswith(("+", "~")):
            recipe = a
        else:
            overrides.append(a)
    return recipe, overrides


def cmd_components(ns: argparse.Namespace) -> int:
    from rlzoo.kernel.kinds import KIND_NAMES
    from rlzoo.kernel.plugins import get_plugin_manager

    pm = get_plugin_manager()
    if ns.kind and ns.kind not in KIND_NAMES:
        from rlzoo.kernel.errors import closest

        near = closest(ns.kind, KIND_NAMES)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        raise RlzooError(f"unknown kind {ns.kind!r}. Kinds: {', '.join(KIND_NAMES)}.{hint}")
    kinds = [ns.kind] if ns.kind else list(KIND_NAMES)
    comps = [c for k in kinds for c in pm.registry(k)]
    if ns.json:
        print(json.dumps([c.to_json() for c in comps], indent=2, default=str))
        return 0
    rows = [[c.kind, c.name, c.plugin, c.summary] for c in comps]
    print(_table(rows, ["kind", "name", "plugin", "summary"]))
    return 0


def cmd_plugins(ns: argparse.Namespace) -> int:
    from rlzoo.kernel.plugins import get_plugin_manager

    infos = get_plugin_manager().plugins(include_all=ns.all)
    if ns.json:
        print(json.dumps([i.to_json() for i in infos], indent=2))
        return 0
    if not infos:
        print("no third-party plugins loaded (rlzoo plugins --all lists the built-ins too)")
        return 0
    failed = [i for i in infos if i.status == "failed"]
    if failed and len(failed) == len(infos) and not ns.all:
        print(f"no third-party plugin loaded; {len(failed)} failed to load:")
    rows = [
        [
            i.name,
            i.version,
            i.status,
            ", ".join(h.removeprefix("rlzoo_") for h in i.hooks),
            ", ".join(i.parts),
        ]
        for i in infos
    ]
    print(_table(rows, ["name", "version", "status", "hooks", "parts"]))
    for i in infos:
        if i.error:
            print(f"  {i.name}: {i.error}")
    return 0


def cmd_recipes(ns: argparse.Namespace) -> int:
    from rlzoo.recipe.files import list_recipes

    recipes = list_recipes()
    if ns.json:
        print(json.dumps({k: str(v) for k, v in sorted(recipes.items())}, indent=2))
        return 0
    print(_table([[k, str(v)] for k, v in sorted(recipes.items())], ["recipe", "file"]))
    return 0


def cmd_validate(ns: argparse.Namespace) -> int:
    from rlzoo.recipe.config import load_config

    recipe, overrides = _split_recipe(ns.args, None)
    if recipe is None:
        raise RlzooError("validate needs a recipe name or path, e.g. `rlzoo validate quickstart`")
    cfg = load_config(recipe, overrides)
    if cfg.stages:  # each stage's recipe too (its overrides, its own rules)
        from rlzoo.kernel.errors import ConfigError
        from rlzoo.kernel.plugins import get_plugin_manager
        from rlzoo.recipe.stages import check_stages

        problems = check_stages(cfg, get_plugin_manager())
        if problems:
            raise ConfigError(problems, header="invalid stages")
        print(f"stages: {', '.join(s.name for s in cfg.stages)} (each checked)")
    print(f"recipe {recipe!r} is valid")
    rows = [[s.key, s.kind, s.name, s.component.plugin] for s in cfg.selections()]
    print(_table(rows, ["key", "kind", "name", "plugin"]))
    return 0


def cmd_train(ns: argparse.Namespace) -> int:
    import time

    from rlzoo.report.console import print_summary, quiet_third_party_progress

    quiet_third_party_progress()  # before transformers / datasets load anything
    from rlzoo.recipe.compose import build_run
    from rlzoo.system.signals import terminate_as_interrupt

    recipe, overrides = _split_recipe(ns.args, None)  # none named: quickstart, or a resume's saved one
    start = time.perf_counter()
    with terminate_as_interrupt():  # SIGTERM (SLURM, Kubernetes, docker stop) stops the run as Ctrl-C does
        run = build_run(recipe, overrides)
        summary = run.train()
    if summary:  # the full summary is in the run directory (summary.json)
        print_summary(summary, recipe=run.config.recipe or "quickstart", wall_s=time.perf_counter() - start)
    return 0


def cmd_prepare(ns: argparse.Namespace) -> int:
    from rlzoo.kernel.errors import ConfigError
    from rlzoo.kernel.plugins import get_plugin_manager
    from rlzoo.recipe.config import bind_part

    pm = get_plugin_manager()
    params: dict[str, Any] = {}
    import yaml

    for o in ns.overrides:
        key, sep, value = o.partition("=")
        if not sep:
            raise RlzooError(f"prepare params are key=value, got {o!r}")
        params[key] = yaml.safe_load(value)
    problems: list[str] = []
    sel = bind_part("dataset", {"name": ns.name, **params}, "prepare", problems, pm)
    if problems or sel is None:
        raise ConfigError(problems, header=f"cannot prepare {ns.name!r}")
    out = Path(ns.out or Path("data") / ns.name).expanduser()
    from rlzoo.system.storage import check_writable

    check_writable(out, "--out")  # read-only / full disk: a message before anything is written
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        files = sel.fn(out, sel.params)
    except BaseException:
        if created and not any(out.iterdir()):  # nothing written: leave no empty folder behind
            out.rmdir()
        raise
    for split, path in files.items():
        print(f"{split}: {path}")
    return 0


def cmd_plot(ns: argparse.Namespace) -> int:
    from rlzoo.report import plot_runs

    for path in plot_runs([Path(d) for d in ns.run_dirs], ns.out, smooth=ns.smooth):
        print(path)
    return 0


def cmd_export(ns: argparse.Namespace) -> int:
    from rlzoo.train.export import export_checkpoint

    print(export_checkpoint(Path(ns.run_dir), Path(ns.out), step=ns.step, adapter=ns.adapter))
    return 0


#: ``--help`` examples of each subcommand (argparse epilog; a test checks every subcommand has some)
EXAMPLES: dict[str, str] = {
    "train": """\
  rlzoo train                                       # the quickstart (CPU, a few minutes)
  rlzoo train quickstart algorithm.advantage.name=rloo trainer.total_steps=30
  rlzoo train dapo_math run.loggers=[console,jsonl,wandb] run.export_every=50
  rlzoo train quickstart resume=true run.output_dir=runs/quickstart-20250101-120000""",
    "validate": """\
  rlzoo validate quickstart
  rlzoo validate quickstart algorithm.policy_loss.name=gspo trainer.total_steps=10
  rlzoo validate src/rlzoo/recipes/dapo_math.yaml run.loggers=[console,mlflow]""",
    "components": """\
  rlzoo components                    # every registered part
  rlzoo components policy_loss        # one kind
  rlzoo components advantage --json""",
    "plugins": """\
  rlzoo plugins                       # third-party plugins
  rlzoo plugins --all                 # built-ins, blocked and failed ones too
  rlzoo plugins --json""",
    "recipes": """\
  rlzoo recipes
  rlzoo recipes --json""",
    "prepare": """\
  rlzoo prepare quickstart --out data/quickstart
  rlzoo prepare geometry3k --out data/geo3k
  rlzoo components dataset            # what can be prepared""",
    "plot": """\
  rlzoo plot runs/quickstart-20250101-120000
  rlzoo plot runs/sync-run runs/async-run --out plots/compare   # overlay two runs
  rlzoo plot runs/async-run --smooth 0.9""",
    "export": """\
  rlzoo export runs/quickstart-20250101-120000 --out models/quickstart           # latest checkpoint
  rlzoo export runs/quickstart-20250101-120000 --step 50 --out models/step50
  rlzoo export runs/lora-run --adapter --out models/adapter       # a trainer.lora run: the PEFT adapter only
      # then: AutoModelForCausalLM.from_pretrained("models/step50")""",
}


def _sub(sub: Any, name: str, summary: str) -> argparse.ArgumentParser:
    """A subcommand parser whose ``--help`` ends with its examples."""
    return sub.add_parser(  # type: ignore[no-any-return]
        name,
        help=summary,
        description=summary[:1].upper() + summary[1:] + ".",
        epilog="Examples:\n" + EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlzoo", description="A pluggable zoo of RL algorithms for LLM post-training."
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command")

    s = _sub(sub, "train", "run a recipe (default: quickstart)")
    s.add_argument("args", nargs="*", help="[RECIPE | recipe=NAME] then key=value overrides")
    s.set_defaults(func=cmd_train)

    s = _sub(sub, "validate", "resolve every name and param of a recipe; loads no model")
    s.add_argument("args", nargs="+", help="RECIPE then key=value overrides")
    s.set_defaults(func=cmd_validate)

    s = _sub(sub, "components", "list registered parts")
    s.add_argument("kind", nargs="?", help="only this kind")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_components)

    s = _sub(sub, "plugins", "list plugins with versions, hooks and parts")
    s.add_argument("--all", action="store_true", help="include built-in, blocked and failed plugins")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_plugins)

    s = _sub(sub, "recipes", "list recipes on the search path")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_recipes)

    s = _sub(sub, "prepare", "prepare a dataset into rlzoo's parquet schema")
    s.add_argument("name", help="registered dataset name (rlzoo components dataset)")
    s.add_argument("--out", help="output folder (default: data/NAME)")
    s.add_argument("overrides", nargs="*", help="preparer params as key=value")
    s.set_defaults(func=cmd_prepare)

    s = _sub(sub, "plot", "render learning curves and a summary of one or more run directories")
    s.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories; several are overlaid")
    s.add_argument("--out", help="output folder (default: RUN_DIR/plots; with several runs, the first's)")
    s.add_argument(
        "--smooth", type=float, default=None, help="EMA weight in [0, 1) (default: chosen by run length)"
    )
    s.set_defaults(func=cmd_plot)

    s = _sub(sub, "export", "write a checkpoint of a run as a standard Hugging Face model folder")
    s.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (rlzoo train prints it)")
    s.add_argument("--step", type=int, help="checkpoint step (default: the latest checkpoint)")
    s.add_argument("--out", required=True, help="output folder (config, tokenizer, safetensors weights)")
    s.add_argument(
        "--adapter",
        action="store_true",
        help="a trainer.lora run: write only its LoRA adapter (a PEFT folder) instead of the merged model",
    )
    s.set_defaults(func=cmd_export)

    for command in _builtin_commands():
        _add_command(sub, command)
    _plugin_commands(sub)
    return p


def _builtin_commands() -> list[Any]:
    """rlzoo's own :class:`~rlzoo.kernel.commands.CliCommand` s (``eval``, ``view``)."""
    from rlzoo.report.view import view_command
    from rlzoo.train.evaluate import eval_command

    return [eval_command(), view_command()]


def _add_command(sub: Any, command: Any) -> None:
    EXAMPLES[command.name] = command.examples
    s = _sub(sub, command.name, command.summary)
    command.add_arguments(s)
    s.set_defaults(func=command.run)


def _plugin_commands(sub: Any) -> None:
    """Subcommands that plugins add (the ``rlzoo_cli_commands`` hook), e.g. ``rlzoo from-verl``."""
    from rlzoo.kernel.plugins import get_plugin_manager

    pm = get_plugin_manager()
    for provided in pm.pluggy.hook.rlzoo_cli_commands():
        for command in provided:
            if command.name in sub.choices:
                raise RlzooError(f"plugin command {command.name!r} is already an rlzoo command")
            _add_command(sub, command)


def _parse_intermixed(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """What ``parse_intermixed_args`` does where argparse refuses it: ``key=value`` words after an
    option (``rlzoo prepare gsm8k --out DIR source=FILE``) join the subcommand's list of them."""
    ns, extra = parser.parse_known_args(argv)
    target = next((k for k in ("overrides", "args") if isinstance(getattr(ns, k, None), list)), None)
    if extra and (target is None or any(a.startswith("-") for a in extra)):
        parser.parse_args(argv)  # argparse's own error for what is left over (exits 2)
    if target is not None:
        getattr(ns, target).extend(extra)
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
    except RlzooError as exc:  # a plugin's command clashes with another
        print(f"rlzoo: error: {exc}", file=sys.stderr)
        return 2
    try:
        ns = parser.parse_intermixed_args(argv)
    except TypeError:  # argparse refuses intermixed parsing with subparsers (Python 3.11)
        ns = _parse_intermixed(parser, argv)
    if ns.version:
        from rlzoo.version import __version__

        print(__version__)
        return 0
    if ns.command is None:
        parser.print_help()
        return 0
    try:
        code = int(ns.func(ns) or 0)
        sys.stdout.flush()  # a closed pipe (`rlzoo components --json | head`) surfaces here
        return code
    except BrokenPipeError:
        # the reader went away, as with `| head`: stop quietly, as command-line tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except RlzooError as exc:
        print(f"rlzoo {ns.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the disk refused a write mid-run (full, read-only): say so, no traceback
        from rlzoo.system.storage import storage_message

        message = storage_message(exc)
        if message is None:
            raise
        print(f"rlzoo {ns.command}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        from rlzoo.system.signals import EXIT_TERMINATED, Terminated

        if isinstance(exc, Terminated):
            print(f"rlzoo {ns.command}: terminated (SIGTERM)", file=sys.stderr)
            return EXIT_TERMINATED
        print(f"rlzoo {ns.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
