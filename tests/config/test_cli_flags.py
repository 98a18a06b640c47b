"""The flags a new user tripped on.

* a bare boolean (`--save_optimizer_state`) followed by another flag must not swallow it,
  and absl's `--noX` form works;
* `--batch_size 8` alone must run (total_batch_size is derived, with a line saying so);
* `--keep_every_steps 10 --save_steps 3` is refused: it would keep only multiples of 30.
"""

import json

import pytest

from cli_runs import run_cli
from trainer_runs import tiny_llmc_model


def test_normalize_booleans_reads_every_gflags_and_absl_spelling():
    from jaxtrain.config.flags import normalize_booleans

    names = {'save_optimizer_state', 'sequence_parallel'}
    argv = ['prog', '--save_optimizer_state', '--num_iteration', '2', '--nosequence_parallel']
    assert normalize_booleans(argv, names) == [
        'prog', '--save_optimizer_state=true', '--num_iteration', '2', '--sequence_parallel=false'
    ]  # fmt: skip
    assert normalize_booleans(['prog', '--sequence_parallel', 'true', '-save_optimizer_state'], names) == [
        'prog', '--sequence_parallel=true', '--save_optimizer_state=true'
    ]  # fmt: skip
    # `--X=V` is left to the parser; so is everything after `--`; a value that is not a
    # boolean stays attached, so the parser can name it.
    same = ['prog', '--save_optimizer_state=0', '--', '--sequence_parallel']
    assert normalize_booleans(same, names) == same
    maybe = normalize_booleans(['prog', '--sequence_parallel', 'maybe'], names)
    assert maybe == ['prog', '--sequence_parallel=maybe']


@pytest.fixture(scope='module')
def files(files):
    return ['--llmc_filepath', files['llmc_filepath'], '--input_bin', files['input_bin']]


def _trainer_state(step_dir):
    return json.loads((step_dir / 'trainer_state' / 'metadata').read_text())


@pytest.mark.parametrize(
    'spelling, saved', [('--save_optimizer_state', True), ('--nosave_optimizer_state', False)]
)
def test_a_bare_boolean_does_not_swallow_the_next_flag(files, tmp_path, spelling, saved):
    ck = tmp_path / 'ck'
    result = run_cli(*files, spelling, '--num_iteration', 1, '--save_steps', 1, '--checkpoint_dir', ck)
    assert result.code == 0, result.err
    step_dir = ck / 'checkpoint_step_000001'
    assert (step_dir / 'opt_state').is_dir() == saved
    assert _trainer_state(step_dir)['has_optimizer_state'] == saved


@pytest.mark.slow
def test_batch_size_alone_derives_total_batch_size(files):
    result = run_cli(*files, '--batch_size', 8, '--num_iteration', 1)
    assert result.code == 0, result.err
    # 8 x 64 = 512 does not divide the default 256: one micro-step of 512 tokens.
    assert 'batch: 8 x 64 x DP 1 (data x fsdp) x accumulation 1 = 512 tokens/step' in result.out
    assert 'total_batch_size: not given' in result.out and 'Pass --total_batch_size' in result.out


def test_keep_every_steps_not_a_multiple_of_save_steps_is_refused(files, tmp_path):
    result = run_cli(*files, '--keep_every_steps', 10, '--save_steps', 3, '--checkpoint_dir', tmp_path / 'ck')
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    assert 'keep_every_steps: expected a multiple of save_steps 3, found 10' in result.err
    assert 'Pass --keep_every_steps 9' in result.err
    assert not (tmp_path / 'ck').exists()


@pytest.mark.slow
def test_overfit_single_batch_trains_on_the_first_batch_only(tmp_path):
    """With overfit_single_batch only tokens 0..256 (the first 4 x 64 window and its last
    target) are ever read: replacing everything after them changes nothing; without it, it does."""
    import numpy as np

    from trainer_runs import load_config, train, write_shard

    model = tiny_llmc_model(tmp_path / 'gpt2.bin')
    tokens = np.random.default_rng(1).integers(0, 512, 4_000)
    other = tokens.copy()
    other[257:] = np.random.default_rng(2).integers(0, 512, len(tokens) - 257)
    runs = {}
    for name, shard_tokens in (('same', tokens), ('other', other)):
        shard = write_shard(tmp_path / f'{name}.bin', shard_tokens)
        for overfit in (True, False):
            config = load_config(
                'gpt2',
                llmc_filepath=model,
                input_bin=shard,
                num_iteration=3,  # at the config's learning rate: the other tests' train step
                overfit_single_batch=overfit,
                metrics_dir=str(tmp_path / f'{name}_{overfit}'),
            )
            code, losses, out = train(config)
            assert code == 0, out
            runs[name, overfit] = [losses[step] for step in (1, 2, 3)]
    assert runs['same', True] == runs['other', True]
    assert runs['same', True][2] < runs['same', True][0]  # the one batch is learned
    assert runs['same', False][0] == runs['other', False][0]  # step 1 reads the same window
    assert runs['same', False][1:] != runs['other', False][1:]


@pytest.mark.parametrize(
    'given, expected',
    [
        ({'num_iteration': 4}, 4),  # a run shorter than llm.c's 20 validates at its last step
        ({'num_iteration': 100}, 20),
        ({'num_iteration': 100, 'keep_best': 2, 'save_steps': 10}, 10),  # at the saves it ranks
        ({'num_iteration': 100, 'val_loss_every': 7}, 7),  # given: kept
    ],
)
def test_a_validation_shard_without_val_loss_every_is_validated(given, expected):
    from jaxtrain.config.flags import derive_val_loss_every
    from trainer_runs import load_config

    config = load_config('gpt2', input_val_bin='val_*.bin', **given)
    notes = []
    derive_val_loss_every(config, notes.append)
    assert config.val_loss_every == expected
    assert len(notes) == (0 if 'val_loss_every' in given else 1)
    assert all(f'every {expected} steps' in note and '--val_loss_every' in note for note in notes)
    without_shard = load_config('gpt2', **given)
    derive_val_loss_every(without_shard, notes.append)
    assert without_shard.val_loss_every == given.get('val_loss_every', 0)
