"""Paths of the wrong kind are refused in one line before anything runs (no step, nothing
on disk changed): a --checkpoint_dir that is a file, an --input_bin that is a directory."""

import os

import pytest

from cli_runs import run_cli, tree_digest
from trainer_runs import random_shard


@pytest.fixture
def shard(tmp_path):
    (tmp_path / 'data').mkdir()
    return random_shard(tmp_path / 'data' / 'train.bin')


def _refused(tmp_path, *args):
    before = tree_digest(tmp_path)
    result = run_cli('--config.model=tiny', '--num_iteration', 2, *args)
    assert result.code == 1, result.out + result.err
    assert len(result.error_lines) == 1, result.err
    assert not [line for line in result.out.splitlines() if line.startswith(('step ', 'compiling'))]
    assert tree_digest(tmp_path) == before
    return result.error_lines[0]


def test_checkpoint_dir_naming_a_file(tmp_path, shard):
    (tmp_path / 'ck').write_text('a file, not a directory')
    line = _refused(tmp_path, '--input_bin', shard, '--checkpoint_dir', tmp_path / 'ck', '--save_steps', 1)
    assert line.startswith(f'error: checkpoint_dir: {tmp_path / "ck"}: expected a directory')
    assert (
        f'found that {tmp_path / "ck"} is a file' in line and 'pass a directory to --checkpoint_dir' in line
    )


def test_checkpoint_dir_under_a_file(tmp_path, shard):
    (tmp_path / 'ck').write_text('a file')
    line = _refused(
        tmp_path, '--input_bin', shard, '--checkpoint_dir', tmp_path / 'ck' / 'run1', '--save_steps', 1
    )
    assert line.startswith(f'error: checkpoint_dir: {tmp_path / "ck" / "run1"}: expected a directory')
    assert f'found that {tmp_path / "ck"} is a file' in line


def test_input_bin_naming_a_directory(tmp_path, shard):
    line = _refused(tmp_path, '--input_bin', tmp_path / 'data')
    assert line.startswith(
        f'error: input_bin: expected llm.c token shard files, found the directory {tmp_path / "data"}'
    )
    assert f"--input_bin '{tmp_path / 'data' / '*.bin'}'" in line
    assert 'Errno' not in line


# --lora_save_path is written after the last step: a path that cannot take the file is refused before
# step 1, or the run would train to the end and then lose its adapters.
def test_lora_save_path_naming_a_directory(tmp_path, shard):
    (tmp_path / 'adapters').mkdir()
    adapters = tmp_path / 'adapters'
    line = _refused(tmp_path, '--input_bin', shard, '--lora_rank', 2, '--lora_save_path', adapters)
    assert line.startswith(f'error: lora_save_path: {adapters}: expected a file to write, found a directory')
    assert f'--lora_save_path {tmp_path / "adapters" / "lora.bin"}' in line


def test_lora_save_path_in_a_missing_directory(tmp_path, shard):
    target = tmp_path / 'no_such_dir' / 'lora.bin'
    line = _refused(tmp_path, '--input_bin', shard, '--lora_rank', 2, '--lora_save_path', target)
    assert line.startswith(f'error: lora_save_path: {target}: expected a file in an existing directory')
    assert f'found no directory {tmp_path / "no_such_dir"}' in line and 'mkdir -p' in line


def test_metrics_dir_under_a_file(tmp_path, shard):
    (tmp_path / 'm').write_text('a file')
    line = _refused(tmp_path, '--input_bin', shard, '--metrics_dir', tmp_path / 'm' / 'run1')
    assert line.startswith(f'error: metrics_dir: {tmp_path / "m" / "run1"}: expected a directory')
    assert f'found that {tmp_path / "m"} is a file' in line and 'pass a directory to --metrics_dir' in line


# What only creating the directory can tell (here: /proc takes no new directory, even from root) is
# one line naming the key, not a bare [Errno 2].
@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')
@pytest.mark.parametrize('key', ['metrics_dir', 'tensorboard_dir'])
def test_a_log_directory_that_cannot_be_created_is_one_line(shard, key):
    result = run_cli('--config.model=tiny', '--num_iteration', 1, '--input_bin', shard, f'--{key}=/proc/jt/x')
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(
        f'error: {key}: /proc/jt/x: expected a directory this run can create and write in, found No such file'
    )
    assert f'pass another --{key}' in result.error_lines[0]
