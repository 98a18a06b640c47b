"""What a checkpoint's record vouches for: its fields are covered by
a digest, refused by resume and reported by `ckpt verify` when edited; it records the
training data's identity, and a resume on other data is refused unless accepted
knowingly; a different --llmc_filepath on resume is named and its sha256 compared."""

import json
import shutil

import pytest
from cli_runs import run_cli
from trainer_runs import random_shard, tiny_llmc_model

from jaxtrain.checkpoint import layout
from jaxtrain.checkpoint import resume_checks
from jaxtrain.tools import ckpt as ckpt_tool


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """One run of two steps on data/train_1.bin (a glob of data/*.bin), saved at step 2."""
    work = tmp_path_factory.mktemp('record_identity')
    model = tiny_llmc_model(work / 'model.bin')
    (work / 'data').mkdir()
    random_shard(work / 'data' / 'train_1.bin')
    common = ['--llmc_filepath', model, '--learning_rate', 1e-3, '--input_bin', work / 'data' / '*.bin']
    result = run_cli(*common, '--checkpoint_dir', work / 'ck', '--save_steps', 2, '--num_iteration', 2)
    assert result.code == 0, result.err
    return work


def _saved_run(saved, tmp_path):
    """A copy of the saved step and its data under tmp_path: (command line, step directory).
    The copied data is the same content at another path ('data moved', which resumes)."""
    shutil.copytree(saved / 'data', tmp_path / 'data')
    step_dir = tmp_path / 'ck' / layout.step_dir_name(2)
    shutil.copytree(saved / 'ck' / layout.step_dir_name(2), step_dir)
    model = str(saved / 'model.bin')
    common = ['--llmc_filepath', model, '--learning_rate', 1e-3, '--input_bin', tmp_path / 'data' / '*.bin']
    return common, step_dir


def _resume(common, step_dir, *args):
    return run_cli(*common, '--resume_from', step_dir, '--num_iteration', 3, *args)


@pytest.mark.slow
@pytest.mark.parametrize('field,value', [('step', 3), ('data_position', 100)])
def test_an_edited_trainer_state_is_refused_by_verify_and_resume(saved, tmp_path, field, value, capsys):
    common, step_dir = _saved_run(saved, tmp_path)
    assert ckpt_tool.main(['verify', str(step_dir)]) == 0
    path = step_dir / layout.TRAINER_STATE_FILE
    record = json.loads(path.read_text())
    record[field] = value  # by hand: the digest stays as it was
    path.write_text(json.dumps(record, indent=2))
    capsys.readouterr()
    assert ckpt_tool.main(['verify', str(step_dir)]) == 1
    assert 'record_sha256' in capsys.readouterr().out
    result = _resume(common, step_dir)
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    assert f'{path}: record_sha256' in result.error_lines[0] and 'edited' in result.error_lines[0]


@pytest.mark.parametrize('field,value', [('step', 3), ('data_position', 100)])
def test_a_record_without_its_digest_is_refused(saved, tmp_path, field, value, capsys):
    """Removing the digest along with an edit used to pass both verify and resume."""
    common, step_dir = _saved_run(saved, tmp_path)
    path = step_dir / layout.TRAINER_STATE_FILE
    record = json.loads(path.read_text())
    del record['record_sha256']
    record[field] = value
    path.write_text(json.dumps(record, indent=2))
    capsys.readouterr()
    assert ckpt_tool.main(['verify', str(step_dir)]) == 1
    assert f'{path}: record_sha256: expected the digest jaxtrain writes' in capsys.readouterr().out
    result = _resume(common, step_dir)
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    line = result.error_lines[0]
    assert f'{path}: record_sha256: expected' in line and 'found none' in line


def test_a_step_directory_under_another_steps_name_is_refused(saved, tmp_path, capsys):
    common, step_dir = _saved_run(saved, tmp_path)
    renamed = step_dir.with_name(layout.step_dir_name(7))
    step_dir.rename(renamed)
    capsys.readouterr()
    assert ckpt_tool.main(['verify', str(renamed)]) == 1
    assert 'step: expected 7, the step its directory is named after, found 2' in capsys.readouterr().out
    result = _resume(common, renamed, '--num_iteration', 9)
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    assert f'{renamed / layout.TRAINER_STATE_FILE}: step: expected 7' in result.error_lines[0]


def _other_tokens(path):
    """Other tokens, same count: the same path and size."""
    random_shard(path, seed=1)


def _cut_short(path):
    random_shard(path, num_tokens=30_000)


def _shard_sorting_first(path):
    random_shard(path.with_name('train_0.bin'), seed=2)


@pytest.mark.parametrize(
    'change,found,accept',
    [
        (_other_tokens, 'other content at the same size', True),
        (_cut_short, 'size checkpoint 81024, now 61024', False),
        (_shard_sorting_first, 'shards: checkpoint 1, now 2', False),
    ],
)
def test_changed_data_is_refused_unless_accepted(saved, tmp_path, change, found, accept):
    common, step_dir = _saved_run(saved, tmp_path)
    change(tmp_path / 'data' / 'train_1.bin')
    refused = _resume(common, step_dir)
    assert refused.code == 1 and len(refused.error_lines) == 1, refused.err
    line = refused.error_lines[0]
    assert f'{step_dir}: data:' in line and found in line and '--accept_changed_data true' in line, line
    if accept:  # the flag is the same for every kind of change; one run shows it
        accepted = _resume(common, step_dir, '--accept_changed_data', 'true')
        assert accepted.code == 0, accepted.err
        assert 'accept_changed_data: training on changed data' in accepted.out and found in accepted.out


@pytest.fixture(scope='module')
def moved(saved, tmp_path_factory):
    """The saved step resumed, with the same model, from a copy of it and its data at another
    path: (command line, step directory, result)."""
    common, step_dir = _saved_run(saved, tmp_path_factory.mktemp('moved'))
    return common, step_dir, _resume(common, step_dir)


def test_moved_data_with_the_same_content_resumes(saved, moved):
    _, _, result = moved
    assert result.code == 0, result.err
    assert f"resume: data moved: shard 0: checkpoint {saved / 'data' / 'train_1.bin'}" in result.out


def test_the_built_in_corpus_records_its_builder():
    import platform

    from jaxtrain.data.default_corpus import CORPUS_VERSION

    saved = resume_checks.data_identity([], built_in=True)
    builder = {'corpus': 'stdlib', 'corpus_version': CORPUS_VERSION, 'python': platform.python_version()}
    assert saved['builder'] == builder
    rebuilt = {**saved, 'builder': {**saved['builder'], 'python': '3.11.9'}}
    different, _ = resume_checks.identity_differences(saved, rebuilt)
    assert different and 'built-in corpus' in different[0]


@pytest.mark.slow
def test_another_llmc_file_on_resume_is_named_and_its_sha256_compared(moved, tmp_path):
    common, step_dir, same = moved  # the same --llmc_filepath as the saved run
    other = tiny_llmc_model(tmp_path / 'other.bin', seed=1)  # the same shape, other weights
    assert same.code == 0 and 'the weights come from the checkpoint' in same.out and 'warning' not in same.out
    changed = _resume([*common[:1], other, *common[2:]], step_dir)
    assert changed.code == 0, changed.err
    assert f'the weights come from the checkpoint {step_dir}' in changed.out
    assert f'warning: --llmc_filepath {other}: sha256' in changed.out and 'differs' in changed.out
