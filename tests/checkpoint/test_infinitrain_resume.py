"""Resuming from InfiniTrain-format checkpoints: our own (bit for bit) and the real binary's (within fp32).

1. Ours: a run saving with --checkpoint_format infinitrain (HEAD files) is resumed from its step 3, once from
   those files and once from the same state converted to the PR generation's llm.c model.bin + optimizer.bin.
   Both continue bit for bit like the uninterrupted run, which tests/checkpoint/test_resume_exact.py shows an
   Orbax resume does too; the final parameters agree exactly. GPT-2 fp32 (SGD) and LLaMA-3 bf16 (Adam).
2. The real binary's: every sample folder resumed from its step-10 checkpoint with its own model, data and
   flags (batch 2 x seq 64, lr 0.01; SGD for GPT-2, Adam for LLaMA-3) prints steps 11-20 within 1e-5 of the
   real b.log (docs/formats.md's fp32 threshold; measured at most 3e-6, the logs round to 6 decimals);
   also the PR generation's pth checkpoint (pr-gpt2/p) against its q.log.
"""

import re

import numpy as np
import pytest

from infinitrain_samples import SAMPLES, run_keys, unpacked
from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain import writer
from jaxtrain.checkpoint.formats.infinitrain.trainer import model_header
from llmc_io.infinitrain.state import PR, InfiniTrainState
from llmc_io.tensors import tree_leaves
from trainer_runs import load_config, random_shard, tiny_llmc_model, train

pytestmark = pytest.mark.slow

# The model, optimizer, dtype and learning rate (the configs' defaults) of
# tests/checkpoint/test_infinitrain_acceptance.py's two cases, so that both files compile one step each.
CASES = {
    'gpt2-fp32-sgd': dict(family='gpt2', dtype='float32', optimizer='sgd'),
    'llama3-bf16-adam': dict(family='llama3', dtype='bfloat16', optimizer='adam'),
}


def _to_pr_bin(src, dst_root):
    """The same state in the PR generation's layout (what `ckpt export --format infinitrain-bin` writes)."""
    ckpt = it.read_checkpoint(src)
    extras = ckpt.state.jaxtrain
    header = model_header(ckpt.family, extras['model_shape'])
    state = InfiniTrainState(
        PR,
        ckpt.state.global_step,
        ckpt.state.data_batch_idx,
        ckpt.state.last_lr,
        best_loss=extras.get('best_loss'),
        optimizer_type='Adam' if ckpt.moments else 'SGD',
        checkpoint_format='bin',
        jaxtrain=extras,
    )
    return writer.write_checkpoint(
        dst_root / src.name, it.PR_BIN_KIND, ckpt.family, ckpt.params, header, ckpt.moments, state
    )


@pytest.mark.parametrize('case', CASES)
def test_resume_from_our_infinitrain_checkpoints_is_bitwise(tmp_path, case):
    options = dict(CASES[case])
    family = options.pop('family')
    files = dict(
        input_bin=random_shard(tmp_path / 'train.bin', kind=family),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin', family),
    )
    common = dict(
        num_iteration=6,
        save_steps=3,
        max_checkpoint_keep=10,
        save_optimizer_state=True,
        checkpoint_format='infinitrain',
        **files,
        **options,
    )
    full = load_config(
        family, checkpoint_dir=str(tmp_path / 'full'), metrics_dir=str(tmp_path / 'm0'), **common
    )
    code, full_losses, _ = train(full)
    assert code == 0 and sorted(full_losses) == list(range(1, 7))
    step3 = tmp_path / 'full' / 'checkpoint_step_000003'
    assert it.detect_kind(step3) == it.HEAD_KIND
    assert (step3 / 'optimizer.ckpt').exists() == (options['optimizer'] == 'adam')
    pr_step3 = _to_pr_bin(step3, tmp_path / 'pr')

    finals = {}
    for name, source, fmt in (('head', step3, 'infinitrain-bin'), ('pr', pr_step3, 'infinitrain')):
        resumed = load_config(
            family,
            checkpoint_dir=str(tmp_path / f'r_{name}'),
            metrics_dir=str(tmp_path / f'm_{name}'),
            resume_from=str(source),
            **{**common, 'checkpoint_format': fmt},
        )
        code, losses, out = train(resumed)
        assert code == 0, out
        assert 'restored step 3' in out and 'was written by InfiniTrain' not in out  # our rng came back
        assert [losses[s] for s in range(4, 7)] == [full_losses[s] for s in range(4, 7)], name
        finals[name] = it.read_checkpoint(tmp_path / f'r_{name}' / 'checkpoint_step_000006')
        assert finals[name].kind == fmt
    uninterrupted = it.read_checkpoint(tmp_path / 'full' / 'checkpoint_step_000006')
    for name, ckpt in finals.items():
        for path, value in tree_leaves(uninterrupted.params).items():
            np.testing.assert_array_equal(tree_leaves(ckpt.params)[path], value, err_msg=f'{name} {path}')
        assert ckpt.state.jaxtrain['data_position'] == 6 and ckpt.state.data_batch_idx == 6
        # The running minimum loss continues across the resume, as InfiniTrain's best_loss does.
        assert ckpt.state.jaxtrain['best_loss'] == min(full_losses.values())


def _log_losses(path):
    found = (re.search(r'step\s+(\d+)/\d+\s+\|\s+train loss\s+([\d.]+)', line) for line in open(path))
    return {int(m.group(1)): float(m.group(2)) for m in found if m}


# (folder, run that saved step 10, log of the real resume from it); pr-gpt2/p is the pth format.
REAL_RESUMES = {
    'gpt2': [('head-gpt2', 'a', 'b.log'), ('pr-gpt2', 'a', 'b.log'), ('pr-gpt2', 'p', 'q.log')],
    'llama3': [('head-llama3', 'a', 'b.log'), ('pr-llama3', 'a', 'b.log')],
}


def _resume_the_real_binarys_checkpoints(family, tmp_path):
    if not SAMPLES.is_dir():
        pytest.skip(f'{SAMPLES} absent')
    real = unpacked()
    worst = {}
    for folder, saved, log in REAL_RESUMES[family]:
        config = load_config(
            family,
            **run_keys(real, folder),
            resume_from=str(real / folder / saved / 'checkpoint_step_000010'),
            metrics_dir=str(tmp_path / f'{folder}-{saved}'),
        )
        code, losses, out = train(config)
        assert code == 0, out
        assert 'restored step 10' in out and 'data position 10' in out
        reference = _log_losses(real / folder / log)
        assert sorted(losses) == sorted(reference) == list(range(11, 21))
        worst[folder, saved] = max(abs(losses[s] - reference[s]) for s in reference)
    assert max(worst.values()) < 1e-5, worst


def test_resume_from_the_real_binarys_gpt2_checkpoints(tmp_path):
    _resume_the_real_binarys_checkpoints('gpt2', tmp_path)


# Compared with the binary's log, not with a program compiled here: XLA's optimizations (fusing the
# 128256-token logits' elementwise work) make these steps several times cheaper.
@pytest.mark.xla_optimized
def test_resume_from_the_real_binarys_llama3_checkpoints(tmp_path):
    _resume_the_real_binarys_checkpoints('llama3', tmp_path)
