"""CONTRIBUTING.md's test tiers select what they say: a `-m` on the command line replaces
pyproject's `-m 'not heavy'`, so the fast tier has to leave the heavy tests out itself."""

import re

from _pytest.mark.expression import Expression

from trainer_runs import REPO


def _tiers() -> dict[str, str]:
    """{the comment after a `python -m pytest -q -m EXPR` line: EXPR} of CONTRIBUTING.md."""
    text = (REPO / 'CONTRIBUTING.md').read_text()
    return {m[2]: m[1] for m in re.finditer(r'python -m pytest -q -m "?([^"#]+?)"? +# (.+)', text)}


def test_the_fast_tier_runs_neither_slow_nor_heavy_tests():
    (fast,) = [expr for comment, expr in _tiers().items() if comment.startswith('the fast tier')]
    selects = Expression.compile(fast).evaluate
    assert not selects(lambda marker: marker == 'slow')
    assert not selects(lambda marker: marker == 'heavy')
    assert selects(lambda marker: False)
