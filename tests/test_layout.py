"""The package layout README describes: nothing imports jaxtrain/tools/ (the tools may
import the trainer), and llmc_io imports nothing of jaxtrain. Read from the source with
`ast`, so an import inside a function counts too."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# `python -m jaxtrain.ckpt|compare_loss|compare_precision|bench|generate` and `jaxtrain`: the tools' entry modules.
ENTRY_MODULES = {'ckpt.py', 'compare_loss.py', 'compare_precision.py', 'bench.py', 'generate.py', 'cli.py'}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f'{node.module}.{alias.name}' for alias in node.names)
    return names


def test_nothing_outside_tools_imports_tools():
    offenders = []
    for path in sorted((REPO / 'jaxtrain').rglob('*.py')):
        relative = path.relative_to(REPO / 'jaxtrain')
        if relative.parts[0] == 'tools' or (len(relative.parts) == 1 and relative.name in ENTRY_MODULES):
            continue
        hits = sorted(m for m in imported_modules(path) if m.startswith('jaxtrain.tools'))
        if hits:
            offenders.append(f'{relative}: {hits}')
    assert offenders == []


def test_llmc_io_stands_alone():
    offenders = [
        f'{path.name}: {sorted(m for m in imported_modules(path) if m.split(".")[0] in ("jaxtrain", "jax", "flax"))}'
        for path in sorted((REPO / 'llmc_io').rglob('*.py'))
        if any(m.split('.')[0] in ('jaxtrain', 'jax', 'flax') for m in imported_modules(path))
    ]
    assert offenders == []
