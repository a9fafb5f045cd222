"""What the ``python_file`` scorer checks when a recipe is validated: the file and its function, read as
text (``ast``), so validating runs none of it. Apart from :mod:`.user_file` (which imports the file)
because the scorer's params class calls it and must not import the scoring code.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from rlzoo.system.user_files import keyword_fit, parse_user_file

#: the keywords verl passes a custom reward function (verl/trainer/ppo/reward.py), in order
VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


def check_function(path: str, name: str, kwargs: Mapping[str, object]) -> None:
    """Refuse, with what is wrong and what would be right, a file or function verl's call cannot use.
    Reads the file as text only."""
    if not path:
        raise ValueError(
            "path is required: the Python file that defines your scoring function, e.g. "
            "{name: python_file, path: my_reward.py, function: compute_score}"
        )
    tree = parse_user_file(path, "path", repr(name))
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if not defs:
        found = sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef))
        raise ValueError(
            f"{path!r} defines no top-level function {name!r} (its functions: {found or 'none'}); set "
            "function to the one that scores"
        )
    fn = defs[-1]  # the last definition wins, as when the module runs
    if isinstance(fn, ast.AsyncFunctionDef):
        raise ValueError(f"{name!r} in {path!r} is async; a scoring function is called synchronously")
    wanted = [*VERL_ARGS, *kwargs]
    missing, unmet = keyword_fit(fn.args, wanted)
    if missing:
        raise ValueError(
            f"{name}() in {path!r} does not accept the keyword(s) {missing}; verl's call passes "
            f"{', '.join(VERL_ARGS)} (and the kwargs setting): add them to its parameters, or **kwargs"
        )
    if unmet:
        raise ValueError(
            f"{name}() in {path!r} requires {unmet}, which verl's call does not pass; give them defaults or "
            "set them in kwargs"
        )
