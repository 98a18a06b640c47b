"""bench/'s scripts are files, not a package: the tests load each from its path."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_bench(name: str):
    """bench/<name>.py as a module named bench_<name>."""
    spec = importlib.util.spec_from_file_location(f'bench_{name}', REPO / 'bench' / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
