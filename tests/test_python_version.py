"""What a Python 3.11 user sees: `pip install .` and `python -m jaxtrain.main` each say first, in one
line, that jaxtrain needs Python 3.12 (pip's own error would be about jax 0.11.2). Runs where a 3.11
interpreter is installed (pyenv's, or python3.11 on PATH)."""

import shutil
import subprocess
from pathlib import Path

import pytest

from trainer_runs import REPO

PYENV_311 = sorted(Path('/root/.pyenv/versions').glob('3.11*/bin/python'))
PYTHON_311 = shutil.which('python3.11') or (PYENV_311[0] if PYENV_311 else None)
needs_311 = pytest.mark.skipif(PYTHON_311 is None, reason='no Python 3.11 installed')


@needs_311
def test_pip_install_on_3_11_says_python_3_12_first(tmp_path):
    source = tmp_path / 'source'  # the build backend refuses at once: pyproject.toml and it suffice
    source.mkdir()
    shutil.copy(REPO / 'pyproject.toml', source)
    shutil.copytree(REPO / 'build_support', source / 'build_support')
    pip = subprocess.run(
        [PYTHON_311, '-m', 'pip', 'install', '--dry-run', '--no-deps', '--no-build-isolation', source],
        capture_output=True, text=True,
    )  # fmt: skip
    assert pip.returncode != 0
    text = pip.stdout + pip.stderr
    said = 'jaxtrain needs Python 3.12 or newer (its pinned jax 0.11.2 does); this pip runs Python 3.11'
    assert said in text, text
    assert 'No matching distribution' not in text


@needs_311
def test_running_on_3_11_is_one_line():
    run = subprocess.run([PYTHON_311, '-m', 'jaxtrain.main'], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout == ''
    assert run.stderr.strip().startswith('jaxtrain needs Python 3.12 or newer; this is Python 3.11')
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
