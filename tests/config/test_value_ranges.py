"""Values of the right type that make no sense are refused before anything runs, each in one
line naming the key, what was expected and what was found."""

import importlib.util

import pytest

from cli_runs import REPO, run_cli, tree_digest
from jaxtrain.checks.config_checks import check_config


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
    assert f'found that {tmp_path / "metrics"} is a file' in line and 'Errno' not in line, line
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize(
    'flag, value', [('--learning_rate', 'nan'), ('--learning_rate', 'inf'), ('--beta2', 'nan')]
)
def test_nan_and_infinity_are_refused_before_step_1(flag, value):
    """NaN passes `< 0` and `0 <= x < 1` alike: it trained, then stopped at a non-finite step."""
    result = run_cli('--config.model=tiny', flag, value, '--num_iteration', 1)
    assert result.code == 1 and not [x for x in result.out.splitlines() if x.startswith('step ')]
    assert result.error_lines == [
        f'error: {flag[2:]}: expected a finite number, found {value} (ValueError; --verbose for a traceback)'
    ]


def test_a_seed_beyond_int64_is_named():
    result = run_cli('--config.model=tiny', '--seed', 2**64, '--num_iteration', 1)
    assert result.code == 1
    expected = f'error: seed: expected an integer in [-2**63, 2**63), found {2**64}'
    assert result.error_lines[0].startswith(expected)


def test_one_key_is_named_once():
    with pytest.raises(ValueError) as refused:
        check_config(_config(learning_rate=-1.0, lr_decay_style='cosine'))
    assert str(refused.value) == 'learning_rate: expected a value >= 0, found -1.0'
