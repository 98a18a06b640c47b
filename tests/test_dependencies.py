"""Every library the code imports is a dependency of the package (a plain `pip install .`
gets it), not only of the test extra: e.g. matplotlib for `compare_loss --plot`. The few
optional ones (OPTIONAL_EXTRAS) are in an extra of their own instead."""

import ast
import importlib.metadata
import re
import sys
import tomllib

from trainer_runs import REPO

# Imported only when their feature is asked for, with a one-line 'pip install' error otherwise.
OPTIONAL_EXTRAS = {'pyarrow': 'parquet', 'wandb': 'wandb', 'torch': 'hf', 'transformers': 'hf'}


def _declared(requirements) -> set[str]:
    return {re.split(r'[<>=\[;! ]', r, maxsplit=1)[0].strip().lower().replace('_', '-') for r in requirements}


def _imported_top_level_names() -> set[str]:
    names = set()
    for package in ('jaxtrain', 'llmc_io'):
        for path in (REPO / package).rglob('*.py'):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split('.')[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split('.')[0])
    return names - set(sys.stdlib_module_names) - {'jaxtrain', 'llmc_io', '__future__'}


def test_every_imported_library_is_a_dependency():
    project = tomllib.loads((REPO / 'pyproject.toml').read_text())['project']
    declared = _declared(project['dependencies'])
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for name in sorted(_imported_top_level_names()):
        if name in OPTIONAL_EXTRAS:
            assert name in _declared(project['optional-dependencies'][OPTIONAL_EXTRAS[name]])
            continue
        dists = {d.lower().replace('_', '-') for d in distributions.get(name, [name])}
        if not dists & declared:
            missing[name] = sorted(dists)
    assert missing == {}, f'imported but not in [project] dependencies: {missing}'
    assert 'matplotlib' in declared
