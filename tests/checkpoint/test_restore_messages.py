"""A damaged checkpoint is refused in one line that says what to do: a
corrupt zstd chunk gives one line with TensorStore's reason and no logged task
tracebacks; the advice names the committed step before the damaged one, and following it
works."""

import glob
import logging
import shutil

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from cli_runs import run_cli
from jaxtrain.checkpoint import layout
from jaxtrain.checkpoint.formats.orbax import restore as orbax_format
from jaxtrain.checkpoint.layout import CheckpointError
from trainer_runs import random_shard, tiny_llmc_model

ZSTD_FRAME = b'\x28\xb5\x2f\xfd'  # the magic number that starts every zstd frame (RFC 8878)


def _corrupt_zstd_frames(item_dir):
    """Flips bytes just after every zstd frame header in the item's data files."""
    for path in glob.glob(f'{item_dir}/ocdbt.process_0/d/*'):
        data = bytearray(open(path, 'rb').read())
        at = data.find(ZSTD_FRAME)
        while at >= 0:
            for k in range(at + 6, min(at + 30, len(data))):
                data[k] ^= 0xFF
            at = data.find(ZSTD_FRAME, at + 4)
        open(path, 'wb').write(data)


def _corrupt_tensor_bytes(item_dir):
    """Flips the bytes in the middle of every data file of an item. The trainer saves its
    tensors uncompressed (manager.py), so this damage reaches the values themselves and is
    caught by the per-tensor checksums."""
    for path in glob.glob(f'{item_dir}/ocdbt.process_0/d/*'):
        data = bytearray(open(path, 'rb').read())
        for k in range(len(data) // 2, min(len(data) // 2 + 64, len(data))):
            data[k] ^= 0xFF
        open(path, 'wb').write(data)


def test_a_corrupt_zstd_chunk_is_one_line_without_logged_tracebacks(tmp_path, caplog):
    """Eight arrays read concurrently: each failed read used to be logged by asyncio with
    its traceback and TensorStore spec (769 lines for GPT-2 124M)."""
    rng = np.random.default_rng(0)
    tree = {f'w{i}': rng.normal(size=(512, 1024)).astype(np.float32) for i in range(8)}
    with ocp.StandardCheckpointer() as writer:
        writer.save(tmp_path / 'params', tree)
    _corrupt_zstd_frames(tmp_path / 'params')
    like = {name: jnp.zeros(a.shape) for name, a in tree.items()}
    with caplog.at_level(logging.INFO), pytest.raises(CheckpointError) as refused:
        orbax_format._restore_item(tmp_path, 'params', like)
    message = str(refused.value)
    assert '\n' not in message and 'ZSTD' in message and 'could not restore' in message, message
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    work = tmp_path_factory.mktemp('restore_messages')
    shard, model = random_shard(work / 'train.bin'), tiny_llmc_model(work / 'model.bin')
    return ['--input_bin', shard, '--llmc_filepath', model, '--learning_rate', 1e-3]


@pytest.mark.slow
def test_the_advice_for_a_damaged_newest_step_names_the_one_before(tiny, tmp_path):
    root = tmp_path / 'ck'
    saving = ['--checkpoint_dir', root, '--save_steps', 2]
    assert run_cli(*tiny, *saving, '--num_iteration', 4).code == 0
    _corrupt_tensor_bytes(root / layout.step_dir_name(4) / 'params')
    damaged = run_cli(*tiny, *saving, '--num_iteration', 6, '--resume_from', 'latest')
    assert damaged.code == 1 and len(damaged.error_lines) == 1, damaged.err
    earlier = root / layout.step_dir_name(2)
    assert f'--resume_from {earlier}' in damaged.error_lines[0], damaged.error_lines[0]
    # Its advice, without the overwrite: the refusal tells how to continue from step 2 here.
    refused = run_cli(*tiny, *saving, '--num_iteration', 6, '--resume_from', earlier)
    assert refused.code == 1, refused.err
    assert 'To continue from step 2 here, pass --config.overwrite_later_checkpoints=true' in refused.err
    overwrite = '--config.overwrite_later_checkpoints=true'
    followed = run_cli(*tiny, *saving, '--num_iteration', 6, '--resume_from', earlier, overwrite)
    assert followed.code == 0 and 'restored step 2' in followed.out, followed.err
    assert layout.committed_steps(root) == [2, 4, 6]
    shutil.rmtree(root)
