"""The calculator of the plain OpenAI agent ``rlzoo.tasks.calc_agent`` (quickstart_gateway's), which
``smol_calc_agent`` shares."""

from __future__ import annotations

from rlzoo.tasks.calc_agent import calc


def test_calc_spaces_its_digits_and_refuses_powers() -> None:
    # by hand: 456 + 789 = 1245, digits as words
    assert calc("4 5 6 + 7 8 9") == "4 5 6 + 7 8 9 = 1 2 4 5"
    assert calc("(2 + 3) * 4") == "( 2 + 3 ) * 4 = 2 0"
    # a power ran in the run's process: 9**9**9 never returns; it used to answer "2 * * 3 = 8"
    assert calc("2**3") == "error: cannot evaluate '2**3'"
    assert calc("4 5 6 +") == "error: SyntaxError"
    assert calc("__import__('os')").startswith("error: cannot evaluate")
