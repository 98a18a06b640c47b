"""XLA's deterministic-GPU flag: asked for by runs that save, left out where only a CPU can run.

The flag changes no CPU kernel, but JAX's compilation cache keys on XLA_FLAGS: a CPU run that
saves would otherwise recompile every program of the same run without saves."""

import os

import pytest

from cli_runs import run_cli
from jaxtrain.parallel import platform
from jaxtrain.train import loop as train_loop
from trainer_runs import random_shard, tiny_llmc_model


@pytest.mark.parametrize(
    'device, platforms, pinned',
    [
        ('cpu', '', True),
        ('auto', 'cpu', True),
        ('auto', ' CPU ', True),
        ('auto', '', False),
        ('cuda', '', False),
    ],
)
def test_pinned_to_cpu_by_the_device_flag_or_jax_platforms(monkeypatch, device, platforms, pinned):
    monkeypatch.setenv('JAX_PLATFORMS', platforms)
    assert platform.pinned_to_cpu(device) is pinned


def test_request_adds_the_flag_once_and_keeps_an_inherited_one(monkeypatch):
    monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=2')
    platform.request_deterministic(True)
    platform.request_deterministic(True)
    assert os.environ['XLA_FLAGS'].split() == [
        '--xla_force_host_platform_device_count=2',
        '--xla_gpu_deterministic_ops=true',
    ]
    assert platform.deterministic_in_effect()
    monkeypatch.setenv('XLA_FLAGS', '--xla_gpu_deterministic_ops=false')
    platform.request_deterministic(True)
    assert os.environ['XLA_FLAGS'] == '--xla_gpu_deterministic_ops=false'
    assert not platform.deterministic_in_effect()


@pytest.mark.parametrize('platforms, asked', [('cpu', False), ('', True)])
def test_a_run_that_saves_asks_for_the_flag_unless_pinned_to_cpu(tmp_path, monkeypatch, platforms, asked):
    """`--deterministic auto` and a checkpoint_dir: the flag is asked for, except on a run that only
    a CPU can run (JAX_PLATFORMS=cpu here; the test process runs on the CPU either way)."""
    requests, runs = [], []
    monkeypatch.setattr(platform, 'request_deterministic', lambda wanted, *a, **k: requests.append(wanted))
    monkeypatch.setenv('JAX_PLATFORMS', platforms)
    # main() asks for the flag before it validates the config and trains: the training itself
    # (which the fake request above leaves unchanged) is left out, main()'s path up to it runs.
    monkeypatch.setattr(train_loop, 'run', lambda config: runs.append(config) or 0)
    files = [
        '--input_bin',
        random_shard(tmp_path / 'train.bin'),
        '--llmc_filepath',
        tiny_llmc_model(tmp_path / 'm.bin'),
    ]
    saving = ['--checkpoint_dir', tmp_path / 'ck', '--save_steps', 1, '--learning_rate', 1e-3]
    result = run_cli(*files, *saving, '--num_iteration', 1, '--device', 'auto')
    assert result.code == 0, result.err
    assert requests == [asked]
    assert [(c.save_steps, c.checkpoint_dir) for c in runs] == [(1, str(tmp_path / 'ck'))]
