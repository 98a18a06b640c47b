"""`pip install .` (not editable): the wheel holds every package and the config files (as
jaxtrain.configs), and an install of it, away from the checkout, resolves `--config=configs/gpt2.py`
from another directory and runs. The expectations are the tree itself (setuptools' own package
finder) and the wheel's file list as pip builds it."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest
from setuptools import find_packages

from trainer_runs import REPO, random_shard


def test_pyproject_lists_every_package_and_maps_the_configs():
    tool = tomllib.loads((REPO / 'pyproject.toml').read_text())['tool']['setuptools']
    found = find_packages(str(REPO), include=['jaxtrain*', 'llmc_io*'])
    assert sorted(tool['packages']) == sorted([*found, 'jaxtrain.configs'])
    assert tool['package-dir'] == {'jaxtrain.configs': 'configs'}


def test_the_dashboards_extra_gives_the_tensorboard_command_the_readme_runs():
    """README runs `tensorboard --logdir`; the extra its set-up installs holds the package whose
    console script that is (tensorboard's own entry point, read from its installed metadata)."""
    from importlib.metadata import distribution

    readme = (REPO / 'README.md').read_text()
    assert 'tensorboard --logdir' in readme and "pip install -e '.[dashboards]'" in readme
    extras = tomllib.loads((REPO / 'pyproject.toml').read_text())['project']['optional-dependencies']
    packages = {re.split(r'[<>=\[]', requirement)[0] for requirement in extras['dashboards']}
    scripts = {
        p: {e.name for e in distribution(p).entry_points if e.group == 'console_scripts'} for p in packages
    }
    assert any('tensorboard' in names for names in scripts.values()), scripts


@pytest.mark.slow  # builds a wheel (about 5 s) and runs the trainer once from it
def test_a_wheel_install_runs_the_default_config_from_another_directory(tmp_path):
    source = tmp_path / 'source'  # a copy, so that the build writes nothing into the checkout
    source.mkdir()
    for name in ('pyproject.toml', 'README.md'):
        shutil.copy(REPO / name, source / name)
    for name in ('jaxtrain', 'llmc_io', 'configs', 'build_support'):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns('__pycache__'))
    pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check', '-q']
    build = subprocess.run(
        [*pip, 'wheel', '--no-deps', '--no-build-isolation', '-w', tmp_path / 'dist', source],
        capture_output=True, text=True,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    [wheel] = (tmp_path / 'dist').glob('jaxtrain-*.whl')
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {'jaxtrain/configs/gpt2.py', 'jaxtrain/configs/llama3.py'} <= names
    assert {f'{p}.py' for p in ('jaxtrain/main', 'jaxtrain/cli', 'llmc_io/shards')} <= names

    site = tmp_path / 'site'
    install = subprocess.run([*pip, 'install', '--no-deps', '--no-index', '--target', site, wheel],
                             capture_output=True, text=True)  # fmt: skip
    assert install.returncode == 0, install.stderr
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    env = {'PATH': '/usr/bin:/bin', 'PYTHONPATH': str(site), 'XLA_FLAGS': '', 'HOME': str(tmp_path)}
    # The session's compilation cache and settings (tests/conftest.py), which say nothing about
    # where jaxtrain is imported from: the second run finds the first one's train step compiled.
    for key in ('JAX_PLATFORMS', 'JAX_COMPILATION_CACHE_DIR', 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS',
                'JAX_DISABLE_MOST_OPTIMIZATIONS'):  # fmt: skip
        env[key] = os.environ[key]
    where = subprocess.run([sys.executable, '-c', 'import jaxtrain; print(jaxtrain.__file__)'],
                           cwd=elsewhere, env=env, capture_output=True, text=True)  # fmt: skip
    assert where.stdout.startswith(str(site)), where  # the installed copy, not the checkout
    shard = random_shard(tmp_path / 'train.bin')
    for config in (['--config=configs/gpt2.py:tiny'], ['--config.model=tiny']):  # named, and the default
        run = subprocess.run(
            [sys.executable, '-m', 'jaxtrain.main', *config, '--input_bin', shard, '--num_iteration', '1'],
            cwd=elsewhere, env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert 'model: gpt2 GPT2Config(max_seq_len=256' in run.stdout and 'step    1/1' in run.stdout
    helped = subprocess.run([sys.executable, '-m', 'jaxtrain.main', '--help'], cwd=elsewhere, env=env,
                            capture_output=True, text=True)  # fmt: skip
    assert "configs/gpt2.py: 'small'" in helped.stdout  # the shipped configs' values, read from the install
