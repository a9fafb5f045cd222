"""verl's language in, an rlzoo recipe out: ``rlzoo from-verl SCRIPT_OR_ARGS [--out FILE]``.

Reads a verl launch command (a shell script running ``python -m verl.trainer.main_ppo`` or verl's
fully-async / one-step-off entry points with ``key=value`` overrides, or the overrides alone),
expands the shell variables it sets (``X=...``, ``${X:-default}``, ``$((arith))``, simple
``if [ "$a" = "b" ]`` blocks), and maps every verl key onto the rlzoo recipe key that does the
same thing. Every key ends in exactly one of four places, all printed: **mapped** (verl key ->
rlzoo key = value), **not needed** (no effect in rlzoo, with the reason: logging names, engine
performance knobs rlzoo sizes itself, ...), **manual** (has an effect rlzoo cannot express; the
step is written into the recipe's header) or **unmappable** (the conversion fails and lists them).
Nothing is dropped silently.

The mapping lives in one data table, :data:`TABLE` (verl key -> rule), plus :data:`VERL_DEFAULTS`
(verl's defaults where rlzoo's differ, applied first so the recipe runs verl's experiment);
``docs/from-verl.md`` shows it (:func:`table_markdown`). Core module: it imports no algorithm or
backend code; part names and params are checked through the plugin registry by ``validate``.
"""

from rlzoo_from_verl.convert import Conversion, convert, from_verl, render
from rlzoo_from_verl.shell import Command, ShellError, parse_command, parse_overrides, parse_value
from rlzoo_from_verl.table import ENTRY_POINTS, TABLE, VERL_DEFAULTS, table_markdown

__all__ = [
    "ENTRY_POINTS",
    "TABLE",
    "VERL_DEFAULTS",
    "Command",
    "Conversion",
    "ShellError",
    "convert",
    "from_verl",
    "parse_command",
    "parse_overrides",
    "parse_value",
    "render",
    "table_markdown",
]
