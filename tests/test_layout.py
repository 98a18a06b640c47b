"""The package layout docs/layout.md and CONTRIBUTING.md describe: nothing imports jaxtrain/tools/
(the tools may import the trainer), llmc_io imports nothing of jaxtrain, no module or package
imports one that imports it back, launch/ holds only launchers, and no source file cites an
issue or a round. Read from the source with `ast`, so an import inside a function counts too."""

import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The tools' entry modules: `python -m jaxtrain.ckpt|compare_loss|compare_precision|bench|generate`
# and `jaxtrain`.
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


def test_config_imports_nothing_above_it():
    """config/ is keys, parsing and choices as data: every other package may read it, so it may
    import none of them (the checks that need the models or the devices live in checks/config_checks.py)."""
    offenders = []
    for path in sorted((REPO / 'jaxtrain' / 'config').rglob('*.py')):
        hits = sorted(
            m
            for m in imported_modules(path)
            if m.startswith('jaxtrain.') and not m.startswith('jaxtrain.config')
        )
        if hits:
            offenders.append(f'{path.name}: {hits}')
    assert offenders == []


def test_llmc_io_stands_alone():
    forbidden = ('jaxtrain', 'jax', 'flax')
    offenders = []
    for path in sorted((REPO / 'llmc_io').rglob('*.py')):
        hits = sorted(m for m in imported_modules(path) if m.split('.')[0] in forbidden)
        if hits:
            offenders.append(f'{path.name}: {hits}')
    assert offenders == []


# --- import cycles --------------------------------------------------------------------
# A module's dependencies: what its imports execute. `from P import name` runs P.name when
# that is a module, else P (its __init__); the implicit import of a module's parent
# packages is left out, or every re-exporting __init__ would be a cycle with its members.
PACKAGES = ('jaxtrain', 'llmc_io')


def _modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in sorted((REPO / top).rglob('*.py')):
            parts = path.relative_to(REPO).with_suffix('').parts
            found['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    return found


def _dependencies(name: str, path: Path, modules: dict) -> set[str]:
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:  # relative: from the package, up level - 1
                anchor = package.split('.')[: len(package.split('.')) - (node.level - 1)]
                base = '.'.join(anchor + ([base] if base else []))
            members = [f'{base}.{alias.name}' for alias in node.names]
            found.update(m for m in members if m in modules)
            if any(m not in modules for m in members):
                found.add(base)
    return {d for d in found if d in modules and d != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _module_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _dependencies(name, path, modules) for name, path in modules.items()}


def _package_of(module: str) -> str:
    """jaxtrain.checkpoint.formats.orbax.restore -> jaxtrain.checkpoint; jaxtrain.main -> jaxtrain."""
    parts = module.split('.')
    if parts[0] != 'jaxtrain' or len(parts) < 2 or not (REPO / 'jaxtrain' / parts[1]).is_dir():
        return parts[0]
    return '.'.join(parts[:2])


def test_no_module_imports_one_that_imports_it_back():
    assert _cycles(_module_graph()) == []


def test_no_package_imports_one_that_imports_it_back():
    packages = {}
    for module, dependencies in _module_graph().items():
        edges = packages.setdefault(_package_of(module), set())
        edges.update(_package_of(d) for d in dependencies if _package_of(d) != _package_of(module))
    assert _cycles(packages) == []


def test_the_cycle_finder_finds_a_cycle():
    """The two tests above pass on an empty answer; this one shows the finder can say otherwise."""
    assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
    assert _cycles({'a': {'b'}, 'b': set()}) == []


# --- the product apart from the lab notebook ---------------------------------------------


def test_launch_holds_only_launchers():
    """Measurements live in bench/ (one entry point); probes stay in git's history."""
    assert sorted(p.name for p in (REPO / 'launch').iterdir()) == [
        'local_multiprocess.sh',
        'one_host.sh',
        'seed_experiment.sh',
        'slurm.sbatch',
    ]


CITATION = re.compile(
    r'\bissues?[ #-]*\d+|\bround (one|two|three|four|five|six|seven|\d+)\b|BENCHMARKS\.md,? round',
    re.IGNORECASE,
)
# Every top-level folder holding source (.ci's one script has no suffix), and the suffixes read.
SOURCE_FOLDERS = ('jaxtrain', 'llmc_io', 'configs', 'launch', 'bench', 'build_support', 'tests', '.ci')
SOURCE_SUFFIXES = ('.py', '.sh', '.sbatch', '.c', '.toml', '')
# Top-level folders of a checkout that hold no source: prose, and what runs and tools leave.
NOT_SOURCE = {
    *('docs', '.git', '.venv', 'venv', 'build', 'ck', 'runs'),
    *('.cache', '.pytest_cache', '.ruff_cache', '.peers'),
}


def _tracked_files() -> set[Path] | None:
    """The files git tracks, or None outside a git checkout. Folders git ignores (a developer's
    copy of the GPU peers, scratch scripts) are nobody's source."""
    try:
        listed = subprocess.run(['git', 'ls-files'], cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return {REPO / line for line in listed.stdout.splitlines()}


def _holds_code(folder: Path, tracked: set[Path] | None) -> bool:
    files = folder.rglob('*') if tracked is None else (p for p in tracked if folder in p.parents)
    return any(p.suffix in ('.py', '.sh', '.sbatch', '.c') for p in files)


def test_every_folder_of_source_is_read_for_citations():
    """A new top-level folder of code is either read by the check below or named above as no source
    (folders of logs, data or models that README's commands leave in a checkout hold no code)."""
    tracked = _tracked_files()
    folders = {
        path.name
        for path in REPO.iterdir()
        if path.is_dir()
        and path.name not in NOT_SOURCE
        and not path.name.endswith('.egg-info')
        and path.name not in SOURCE_FOLDERS
        and _holds_code(path, tracked)
    }
    assert folders == set()


def test_the_citation_pattern_tells_history_from_prose():
    for history in ('# see issue 26', '# Issue #31: why', '# issues 26-32', '# as in round two'):
        assert CITATION.search(history), history
    for prose in ('# a save/load round trip', '# values round to +-inf', '# InfiniTrain PR 151'):
        assert not CITATION.search(prose), prose


def test_no_source_file_cites_an_issue_or_a_round():
    """A comment says why in terms of the code; history goes to commit bodies."""
    offenders = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((REPO / folder).rglob('*')):
            if not path.is_file() or path.suffix not in SOURCE_SUFFIXES or 'fixtures' in path.parts:
                continue
            if path == Path(__file__):  # its own examples of what the check finds
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if CITATION.search(line):
                    offenders.append(f'{path.relative_to(REPO)}:{number}: {line.strip()}')
    assert offenders == []


# The rooms of docs/layout.md's drawing, bottom to top; a room imports only rooms below it or
# beside it (the same rank). `jaxtrain` is the entry modules at the top (main.py, cli.py, ...).
ROOM_RANKS = {
    'llmc_io': 0,
    'jaxtrain.config': 1,
    'jaxtrain.models': 2,
    'jaxtrain.data': 2,
    'jaxtrain.optim': 2,
    'jaxtrain.parallel': 2,
    'jaxtrain.checkpoint': 3,
    'jaxtrain.checks': 4,
    'jaxtrain.train': 4,
    'jaxtrain.tools': 5,
    'jaxtrain': 5,
}


def test_every_room_imports_only_rooms_below_or_beside_it():
    packages = {_package_of(module) for module in _module_graph()}
    assert packages <= set(ROOM_RANKS), (
        f'a package docs/layout.md does not draw: {packages - set(ROOM_RANKS)}'
    )
    upward = [
        f'{module} -> {dependency}'
        for module, dependencies in sorted(_module_graph().items())
        for dependency in sorted(dependencies)
        if ROOM_RANKS[_package_of(dependency)] > ROOM_RANKS[_package_of(module)]
    ]
    assert upward == []
