"""The config files: `--config=configs/...` from any directory, and docstrings that say
only true things (the flags they show exist, the variants they list are the models')."""

import ast
import re
import sys

import pytest
from cli_runs import run_cli
from trainer_runs import REPO, random_shard

from jaxtrain.config.keys import resolve_config_argument
from jaxtrain.config.keys import KEYS
from jaxtrain.models import gpt2, llama3


def test_relative_config_path_works_from_another_directory(tmp_path, monkeypatch):
    shard = random_shard(tmp_path / 'train.bin')
    monkeypatch.chdir(tmp_path)
    assert not (tmp_path / 'configs').exists()
    result = run_cli('--config=configs/gpt2.py:tiny', '--input_bin', shard, '--num_iteration', 0, config=None)
    assert result.code == 0, result.err
    assert 'model: gpt2 GPT2Config(max_seq_len=256' in result.out and 'nothing to do' in result.out


def test_resolution_prefers_the_working_directory_and_keeps_unknown_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config_argument(['p', '--config', 'configs/llama3.py:tiny']) == [
        'p',
        '--config',
        f'{REPO}/configs/llama3.py:tiny',
    ]
    (tmp_path / 'configs').mkdir()
    (tmp_path / 'configs' / 'gpt2.py').write_text('# a local config wins')
    assert resolve_config_argument(['p', '--config=configs/gpt2.py']) == ['p', '--config=configs/gpt2.py']
    assert resolve_config_argument(['p', '--config=configs/none.py']) == ['p', '--config=configs/none.py']
    result = run_cli('--config=configs/none.py', config=None)
    assert result.code == 1 and 'found nothing at configs/none.py' in result.err


@pytest.mark.parametrize('family, variants', [('gpt2', gpt2.VARIANTS), ('llama3', llama3.VARIANTS)])
def test_config_docstrings_name_real_flags_and_variants(family, variants):
    doc = ast.get_docstring(ast.parse((REPO / 'configs' / f'{family}.py').read_text()))
    keys = {key for key, _, _ in KEYS} | {'config'}
    trainer_text = re.sub(r'`python -m llmc_io[^`]*`', '', doc)  # another tool's flags
    assert set(re.findall(r'--(\w+)', trainer_text)) <= keys
    listed = (
        re.search(rf'configs/{family}\.py:([\w.|-]+)', doc.split('Variants:')[1])
        .group(1)
        .rstrip('.')
        .split('|')
    )
    assert set(listed) == set(variants)
    assert 'is not\npromised' not in doc and 'is not promised' not in doc


def test_plain_llama3_config_is_a_small_model_and_the_1b_shape_stays_named():
    """A first run of configs/llama3.py must fit a laptop, as configs/gpt2.py's `small` does (16M)."""
    from trainer_runs import load_config

    plain = load_config('llama3', '')
    assert plain.model == 'tiny' and llama3.VARIANTS['tiny'].num_parameters < 20e6
    assert plain.learning_rate == 1e-2  # learns visibly in the 10 default steps
    named = load_config('llama3', 'llama3.2-1b')
    assert named.learning_rate == 1e-5 and llama3.VARIANTS['llama3.2-1b'].num_parameters > 1.2e9
    assert load_config('llama3', 'infinitrain').learning_rate == 1e-5


@pytest.mark.parametrize(
    'text, expected',
    [
        ('raise RuntimeError("boom")\n', 'found that it raised RuntimeError: boom'),
        ('def get_config(:\n', 'expected a Python file, found a syntax error at line 1'),
        ('def get_config(arg=None):\n    return None\n', 'expected get_config to return an ml_collections'),
        ('x = 1\n', 'expected a function get_config(variant) returning a ConfigDict, found none'),
        ('def get_config(arg=None):\n    raise KeyError("k")\n', 'found that it raised KeyError'),
    ],
)
def test_a_config_file_that_cannot_be_loaded_is_one_line(tmp_path, monkeypatch, text, expected):
    # ml_collections loads every config file as the module config_config, into the one an earlier
    # command line left in this process (which may define get_config): start without it.
    monkeypatch.delitem(sys.modules, 'config_config', raising=False)
    path = tmp_path / 'my_config.py'
    path.write_text(text)
    result = run_cli('--num_iteration', 1, config=str(path))
    assert result.code == 1, result.out + result.err
    assert len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(f'error: --config: {path}: expected ')
    assert expected in result.error_lines[0]
    assert 'Traceback' not in result.err
