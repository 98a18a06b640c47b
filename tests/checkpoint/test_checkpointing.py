"""Checkpoint policy and resume behaviour of the real trainer on a tiny model."""

import json
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxtrain.checkpoint import layout as ckpt_layout
from jaxtrain.checkpoint import resume as ckpt_resume
from trainer_runs import load_config, tiny_llmc_model, train


@pytest.fixture(scope='module')
def saved(files, tmp_path_factory):
    """Runs trained once for the tests that only read their checkpoints or copy them: 'full'
    (four steps, saved at 2 and 4; its losses are the uninterrupted run a resume must repeat) and
    'params_only' (three steps, saved at 2 and at the last step without optimizer state). Each run
    costs seconds of CPU."""
    root = tmp_path_factory.mktemp('saved')
    runs = {
        'full': dict(num_iteration=4, save_steps=2),
        'params_only': dict(num_iteration=3, save_steps=2, save_optimizer_state=False),
    }
    for name, overrides in runs.items():
        code, losses, out = train(config(files, root, name, **overrides))
        assert code == 0, out
        assert sorted(losses) == list(range(1, overrides['num_iteration'] + 1))
        (root / f'{name}-losses.json').write_text(json.dumps(losses))
    assert steps_in(root / 'full') == [2, 4]
    return root


def full_losses(saved) -> dict[int, float]:
    return {int(step): loss for step, loss in json.loads((saved / 'full-losses.json').read_text()).items()}


def copy_of(saved, name, tmp_path, upto=None):
    """tmp_path/'ck': a copy of the saved run `name`'s checkpoints, for a test that changes them;
    with `upto`, only its steps up to that one (what a run stopped after that step left)."""
    root = shutil.copytree(saved / name, tmp_path / 'ck')
    for step in steps_in(root):
        if upto is not None and step > upto:
            shutil.rmtree(root / f'checkpoint_step_{step:06d}')
    return root


def config(files, tmp_path, name, **overrides):
    settings = dict(
        files,
        checkpoint_dir=str(tmp_path / name),
        metrics_dir=str(tmp_path / f'{name}-metrics'),
        learning_rate=1e-3,
    )
    settings.update(overrides)
    return load_config('gpt2', **settings)


def steps_in(path):
    return ckpt_layout.committed_steps(path)


@pytest.mark.slow
def test_rotation_keeps_newest_k_and_every_multiple(files, tmp_path):
    code, _, _ = train(
        config(
            files, tmp_path, 'ck', num_iteration=7, save_steps=2, max_checkpoint_keep=2, keep_every_steps=4
        )
    )
    assert code == 0
    # newest two (6, 7: the last step is always saved) plus multiples of 4 (4); 2 rotated out
    assert steps_in(tmp_path / 'ck') == [4, 6, 7]


@pytest.fixture(scope='module')
def fresh_latest(files, tmp_path_factory):
    """A two-step run with save_steps 0 and --resume_from latest into an empty checkpoint_dir:
    (its root, exit code, losses, stdout)."""
    root = tmp_path_factory.mktemp('fresh_latest')
    code, losses, out = train(config(files, root, 'ck', num_iteration=2, save_steps=0, resume_from='latest'))
    return root / 'ck', code, losses, out


def test_save_steps_zero_writes_nothing(fresh_latest):
    root, code, losses, _ = fresh_latest
    assert code == 0 and len(losses) == 2
    assert steps_in(root) == []


def test_last_step_is_saved(saved):
    # params_only: three steps, save_steps 2
    assert steps_in(saved / 'params_only') == [2, 3]


@pytest.mark.slow
def test_checkpoint_contents(files, saved):
    step_dir = saved / 'params_only' / 'checkpoint_step_000002'
    state = json.loads((step_dir / 'trainer_state' / 'metadata').read_text())
    assert state['step'] == 2 and state['data_position'] == 2
    assert state['model_config']['vocab_size'] == 512 and state['model_family'] == 'gpt2'
    assert state['llmc_file'] == files['llmc_filepath'] and len(state['llmc_sha256']) == 64
    assert state['has_optimizer_state'] is False and not (step_dir / 'opt_state').exists()
    assert 'h/attn/c_attn/kernel' in state['checksums']['params']
    assert state['topology']['device_count'] == 1 and state['versions']['jax'] == jax.__version__


@pytest.mark.slow
def test_params_only_checkpoint_resumes_with_fresh_moments(files, saved, tmp_path):
    resume_from = str(saved / 'params_only' / 'checkpoint_step_000002')
    code, losses, out = train(config(files, tmp_path, 'b', num_iteration=4, resume_from=resume_from))
    assert code == 0 and sorted(losses) == [3, 4]
    assert out.count('fresh optimizer moments') == 1


def test_latest_resumes_in_place_and_matches_uninterrupted(files, saved, tmp_path):
    copy_of(saved, 'full', tmp_path, upto=2)  # the full run's root as a run stopped after step 2 left it
    code, resumed, out = train(
        config(
            files,
            tmp_path,
            'ck',
            num_iteration=4,
            save_steps=2,
            resume_from='latest',
            metrics_dir=str(tmp_path / 'resumed-metrics'),
        )
    )
    full = full_losses(saved)
    assert code == 0 and 'restored step 2' in out
    assert sorted(resumed) == [3, 4] and [resumed[s] for s in (3, 4)] == [full[s] for s in (3, 4)]
    assert steps_in(tmp_path / 'ck') == [2, 4]


def test_latest_with_no_checkpoint_starts_fresh_with_notice(fresh_latest):
    _, code, losses, out = fresh_latest
    assert code == 0 and sorted(losses) == [1, 2]
    assert 'no committed checkpoint' in out and 'starting fresh' in out


def test_incompatible_checkpoint_lists_every_field(files, saved, tmp_path):
    step_dir = str(saved / 'full' / 'checkpoint_step_000002')
    other_model = tiny_llmc_model(tmp_path / 'other.bin', vocab=256)
    with pytest.raises(ckpt_layout.CheckpointError) as error:
        train(
            config(
                files,
                tmp_path,
                'b',
                num_iteration=3,
                resume_from=step_dir,
                llmc_filepath=other_model,
                sequence_length=32,
                total_batch_size=128,
                optimizer='sgd',
            )
        )
    message = str(error.value)
    for field in (
        'model_config.vocab_size: checkpoint 512, now 256',
        "optimizer: checkpoint 'adamw', now 'sgd'",
        'sequence_length: checkpoint 64, now 32',
        'total_batch_size: checkpoint 256, now 128',
    ):
        assert field in message
    assert '\n' not in message


@pytest.mark.slow
def test_allowed_changes_are_reported(files, saved, tmp_path):
    code, _, out = train(
        config(
            files,
            tmp_path,
            'b',
            num_iteration=3,
            learning_rate=5e-4,
            resume_from=str(saved / 'full' / 'checkpoint_step_000002'),
        )
    )
    assert code == 0
    assert 'learning_rate: checkpoint 0.001, now 0.0005' in out
    assert 'num_iteration: checkpoint 4, now 3' in out


@pytest.mark.slow
def test_resume_into_dir_with_later_steps_is_refused_then_overwritten(files, saved, tmp_path):
    copy_of(saved, 'full', tmp_path)  # steps 2 and 4
    early = str(tmp_path / 'ck' / 'checkpoint_step_000002')
    with pytest.raises(ckpt_layout.CheckpointError, match='checkpoint_step_000004') as error:
        train(config(files, tmp_path, 'ck', num_iteration=4, save_steps=2, resume_from=early))
    assert 'overwrite_later_checkpoints' in str(error.value)
    assert steps_in(tmp_path / 'ck') == [2, 4]  # nothing touched
    code, _, _ = train(
        config(
            files,
            tmp_path,
            'ck',
            num_iteration=3,
            save_steps=2,
            resume_from=early,
            overwrite_later_checkpoints=True,
        )
    )
    assert code == 0 and steps_in(tmp_path / 'ck') == [2, 3]


def test_fresh_run_into_used_dir_is_refused(files, saved, tmp_path):
    copy_of(saved, 'full', tmp_path)
    with pytest.raises(ckpt_layout.CheckpointError, match='expected no checkpoints after step 0'):
        train(config(files, tmp_path, 'ck', num_iteration=2, save_steps=2))


def test_uncommitted_save_is_never_latest_and_is_cleaned(files, saved, tmp_path):
    root = copy_of(saved, 'full', tmp_path, upto=2)
    # What a save killed half-way leaves: Orbax's temporary directory, never renamed.
    partial = root / 'checkpoint_step_000003.orbax-checkpoint-tmp-1234'
    shutil.copytree(root / 'checkpoint_step_000002', partial)
    (partial / 'trainer_state' / 'metadata').unlink()
    assert steps_in(root) == [2]
    assert ckpt_resume.resolve_resume('latest', str(root))[0].name == 'checkpoint_step_000002'
    code, _, out = train(config(files, tmp_path, 'ck', num_iteration=3, save_steps=1, resume_from='latest'))
    assert code == 0 and 'restored step 2' in out
    assert not partial.exists() and steps_in(root) == [2, 3]


def test_corrupted_tensor_fails_its_checksum_naming_it(files, saved, tmp_path):
    step_dir = copy_of(saved, 'full', tmp_path) / 'checkpoint_step_000002'
    params = ocp.StandardCheckpointer().restore(step_dir / 'params')
    params['h']['mlp']['c_fc']['kernel'] = np.asarray(params['h']['mlp']['c_fc']['kernel']).copy()
    params['h']['mlp']['c_fc']['kernel'][0, 1, 2] += 1e-3
    shutil.rmtree(step_dir / 'params')
    with ocp.StandardCheckpointer() as writer:
        writer.save(step_dir / 'params', params)
    with pytest.raises(ckpt_layout.CheckpointError, match='params/h/mlp/c_fc/kernel: checksum expected'):
        train(config(files, tmp_path, 'b', num_iteration=3, resume_from=str(step_dir)))


@pytest.mark.parametrize(
    'resume_from,expected',
    [
        ('{tmp}/nowhere', 'found nothing there'),
        ('{saved}/params_only', 'found a checkpoint root holding checkpoint_step_000002'),
        ('{tmp}/not-a-checkpoint', 'not a checkpoint'),
    ],
)
def test_bad_resume_paths(files, saved, tmp_path, resume_from, expected):
    (tmp_path / 'not-a-checkpoint').mkdir()
    resume_from = resume_from.format(tmp=tmp_path, saved=saved)
    with pytest.raises(ckpt_layout.CheckpointError, match=expected):
        train(config(files, tmp_path, 'b', num_iteration=2, resume_from=resume_from))
