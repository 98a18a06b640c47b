"""Values of the right type that make no sense are refused before anything runs, each in one
line naming the key, what was expected and what was found."""

import importlib.util

import pytest

from cli_runs import REPO, run_cli, tree_digest
from jaxtrain.config.checks import check_config


def _config(**overrides):
    spec = importlib.util.spec_from_file_location('gpt2_config', REPO / 'configs' / 'gpt2.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config('tiny')
    config.update(overrides)
    return config


@pytest.mark.parametrize(
    'key,value,expected',
    [
        ('min_lr_ratio', -1.0, 'min_lr_ratio: expected 0..1 (a fraction of learning_rate), found -1.0'),
        ('min_lr_ratio', 1.5, 'min_lr_ratio: expected 0..1'),
        ('beta1', -0.1, 'beta1: expected 0 <= beta1 < 1, found -0.1'),
        ('beta2', 1.5, 'beta2: expected 0 <= beta2 < 1, found 1.5'),
        ('beta2', 1.0, 'beta2: expected 0 <= beta2 < 1, found 1.0'),
        ('eps', -1.0, 'eps: expected a value > 0, found -1.0'),
        ('eps', 0.0, 'eps: expected a value > 0, found 0.0'),
        ('val_max_steps', 0, 'val_max_steps: expected at least 1 batch per evaluation, found 0'),
    ],
)
def test_a_value_out_of_range_is_named(key, value, expected):
    with pytest.raises(ValueError) as refused:
        check_config(_config(**{key: value}))
    assert expected in str(refused.value)


def test_the_defaults_and_edges_are_accepted():
    check_config(_config())
    check_config(_config(min_lr_ratio=0.0, beta1=0.0, beta2=0.999, eps=1e-12, val_max_steps=1))
    check_config(_config(min_lr_ratio=1.0))


@pytest.mark.parametrize('under', [False, True])
def test_a_file_as_metrics_dir_is_one_line_and_changes_nothing(tmp_path, under):
    (tmp_path / 'metrics').write_text('a file')
    metrics_dir = tmp_path / 'metrics' / 'run' if under else tmp_path / 'metrics'
    before = tree_digest(tmp_path)
    result = run_cli('--metrics_dir', metrics_dir, '--num_iteration', 1, '--checkpoint_dir', tmp_path / 'ck')
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    line = result.error_lines[0]
    assert f'metrics_dir: {metrics_dir}: expected a directory' in line, line
    assert f'found {tmp_path / "metrics"} is a file' in line and 'Errno' not in line, line
    assert tree_digest(tmp_path) == before
