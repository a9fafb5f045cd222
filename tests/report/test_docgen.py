"""The reference docs are generated from the code and kept up to date."""

from __future__ import annotations

from pathlib import Path

from rlzoo.kernel.kinds import KINDS
from rlzoo.kernel.plugins import PluginManager
from rlzoo.report.docgen import (
    builtin_plugin_manager,
    components_reference,
    generate,
    hook_functions,
    hooks_reference,
)

ROOT = Path(__file__).resolve().parents[2]


def test_hooks_reference_covers_every_hook() -> None:
    text = hooks_reference()
    for f in hook_functions():
        assert f"### `{f.__name__}(" in text
        assert (f.__doc__ or "").strip().splitlines()[0] in text


def test_components_reference_covers_every_part(pm: PluginManager) -> None:
    text = components_reference(pm)  # with the installed third-party plugins too
    for kind in KINDS:
        assert f"\n## {kind.name}\n" in text
        for comp in pm.registry(kind.name):
            assert f"\n### {kind.name}: {comp.name}\n" in text
            for p in comp.param_fields():
                assert f"| `{p['name']}` |" in text


def test_reference_files_are_up_to_date() -> None:
    """Regenerate with `python -m rlzoo.report.docgen` when this fails."""
    stale = [
        str(path.relative_to(ROOT))
        for path, text in generate(ROOT / "docs" / "reference").items()
        if not path.exists() or path.read_text() != text
    ]
    assert not stale, f"stale generated docs {stale}: run `python -m rlzoo.report.docgen`"


def test_builtin_reference_ignores_entry_points() -> None:
    infos = builtin_plugin_manager().plugins(include_all=True)
    assert all(i.builtin or i.status == "disabled" for i in infos)
