"""bench/orbax_save_levers.py end to end on the CPU at the tiny model's size: the save commits, and
the steps after it and the thread samples from its start are reported (the copy settings it changes
act on a GPU only). Its piece-by-piece copy gives Orbax the bytes that Orbax's own copy gives."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bench_loader import load_bench
from orbax.checkpoint._src.serialization import replica_slices
from trainer_runs import REPO, random_shard


def test_pieces_reach_the_host_as_orbaxs_own_copy_does(monkeypatch):
    levers = load_bench('orbax_save_levers')
    orbax_copy = replica_slices.transfer_arrays_to_host
    monkeypatch.setattr(replica_slices, 'transfer_arrays_to_host', orbax_copy)  # put back afterwards
    levers.copy_in_pieces(1000)
    assert replica_slices.transfer_arrays_to_host is not orbax_copy
    arrays = [
        jnp.arange(16 * 8 * 16, dtype=jnp.float32).reshape(16, 8, 16),  # 512 B a row: 1 row a piece
        (jnp.arange(300 * 7) % 251).astype(jnp.bfloat16).reshape(300, 7),  # 71 rows a piece, 5 pieces
        jnp.float32(3.0),
        jnp.arange(5),
    ]
    assert [len(levers._row_pieces(a, 1000)) for a in arrays] == [16, 5, 1, 1]
    ours = replica_slices.transfer_arrays_to_host(arrays, None, False, enable_pinned_host_transfer=True)
    theirs = orbax_copy(arrays, None, False, enable_pinned_host_transfer=True)
    for mine, reference, array in zip(ours, theirs, arrays):
        assert mine.is_on_host and mine.local_shape == reference.local_shape == array.shape
        (got,), (want,) = mine.replica_slices, reference.replica_slices
        assert got.index == want.index and got.slice_args is None
        assert got.unsliced_data.dtype == want.unsliced_data.dtype
        np.testing.assert_array_equal(got.unsliced_data, np.asarray(jax.device_get(array)))
        np.testing.assert_array_equal(got.unsliced_data, want.unsliced_data)


@pytest.mark.slow  # a training run in a process of its own
def test_a_save_reports_its_figures_and_where_the_threads_were(tmp_path):
    shard = random_shard(tmp_path / 'train.bin')
    run = subprocess.run(
        [sys.executable, REPO / 'bench' / 'orbax_save_levers.py', tmp_path / 'out', '--input_bin', shard,
         '--config', 'configs/gpt2.py:tiny', '--batch_size', '2', '--sequence_length', '64',
         '--steps', '14', '--save_step', '10', '--host_gb', '0.0005', '--sample_s', '0.2'],
        capture_output=True, text=True, timeout=180, cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'},  # one CPU device, not the tests' 8
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    result = json.loads(next(line for line in lines if line.startswith('{"settings"')))
    assert result['median_step_ms'] > 0 and 0 <= result['blocked_ms'] < 1e3
    assert len(result['after_save_vs_median']) == 4  # steps 11-14
    assert 0 < result['commit_s'] < 60
    assert (tmp_path / 'out' / 'ck' / 'checkpoint_step_000010' / 'params').is_dir()
    samples = [line for line in lines if ' ms x' in line]
    assert samples and all('MainThread: ' in line for line in samples)
