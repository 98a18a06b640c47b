"""A run deletes only step directories it wrote: in either format a directory with a step's name
that holds no checkpoint of that format is set aside (renamed, its files kept), and a step
directory that is a symbolic link is never deleted by rotation, which used to stop the run at
its last save with the advice to free space."""

import os
import shutil

import pytest
from trainer_runs import load_config, train

from jaxtrain.checkpoint import layout
from jaxtrain.checkpoint.formats.infinitrain import steps as it

pytestmark = pytest.mark.slow  # real runs of the trainer, in this process


@pytest.fixture(scope='module')
def files(files):
    # The suite's tiny model (conftest.py) at test_checkpointing.py's rate: its compiled programs.
    return {**files, 'learning_rate': 1e-3}


@pytest.fixture(scope='module')
def elsewhere(files, tmp_path_factory):
    """elsewhere(fmt): the checkpoint_dir of one 4-step run in that format saving steps 2 and
    4 (made once), which the tests link to and copy from but do not write."""
    roots = {}

    def saved(fmt):
        if fmt not in roots:
            roots[fmt] = tmp_path_factory.mktemp(f'elsewhere_{fmt}') / 'ck'
            run(files, roots[fmt], fmt, num_iteration=4, save_steps=2)
        return roots[fmt]

    return saved


def run(files, root, fmt, **overrides):
    config = load_config('gpt2', **files, checkpoint_dir=str(root), checkpoint_format=fmt, sample_every=0)
    config.update(overrides)
    code, _, out = train(config)
    assert code == 0, out
    return out


def test_an_infinitrain_run_sets_aside_a_step_directory_it_did_not_write(files, tmp_path):
    mine = tmp_path / 'ck' / 'checkpoint_step_000002'
    mine.mkdir(parents=True)
    (mine / 'notes.txt').write_text('the user keeps this')
    out = run(files, tmp_path / 'ck', 'infinitrain', num_iteration=2, save_steps=1)
    assert "set aside: ['checkpoint_step_000002.uncommitted']" in out
    aside = tmp_path / 'ck' / 'checkpoint_step_000002.uncommitted'
    assert (aside / 'notes.txt').read_text() == 'the user keeps this'
    assert it.detect_kind(mine) == it.HEAD_KIND  # the run's own step 2 was written


@pytest.mark.parametrize('fmt', ['orbax', 'infinitrain'])
def test_rotation_keeps_a_symlinked_step_and_writes_the_last_one(files, elsewhere, tmp_path, fmt):
    elsewhere, root = elsewhere(fmt), tmp_path / 'ck'
    root.mkdir()
    os.symlink(elsewhere / 'checkpoint_step_000002', root / 'checkpoint_step_000002')
    shutil.copytree(elsewhere / 'checkpoint_step_000004', root / 'checkpoint_step_000004')
    out = run(files, root, fmt, num_iteration=6, save_steps=2, max_checkpoint_keep=1, resume_from='latest')
    assert 'symbolic links, kept out of rotation (never deleted): checkpoint_step_000002' in out
    assert (root / 'checkpoint_step_000002').is_symlink()
    assert sorted(p.name for p in (elsewhere / 'checkpoint_step_000002').iterdir())  # its files untouched
    names = sorted(p.name for p in root.iterdir() if layout.step_of(p) is not None)
    assert names == ['checkpoint_step_000002', 'checkpoint_step_000004', 'checkpoint_step_000006']
    assert f'saved: {root / "checkpoint_step_000006"}' in out


def test_overwrite_later_checkpoints_deletes_no_link(files, elsewhere, tmp_path):
    elsewhere, root = elsewhere('orbax'), tmp_path / 'ck'
    root.mkdir()
    os.symlink(elsewhere / 'checkpoint_step_000002', root / 'checkpoint_step_000002')
    config = load_config('gpt2', **files, checkpoint_dir=str(root), num_iteration=1, sample_every=0)
    config.overwrite_later_checkpoints = True
    from jaxtrain.checkpoint.layout import CheckpointError

    with pytest.raises(CheckpointError, match='found a symbolic link to .*jaxtrain deletes no links'):
        train(config)
    assert (root / 'checkpoint_step_000002').is_symlink() and (elsewhere / 'checkpoint_step_000002').is_dir()


@pytest.mark.parametrize('fmt', ['orbax', 'infinitrain'])
def test_a_resumed_run_never_rotates_away_another_runs_step(files, elsewhere, tmp_path, fmt):
    """A run resumed from elsewhere into a root that holds another run's step 2 rotates only its
    own saves (--max_checkpoint_keep 1): step 2 stays, step 5 goes. The saves carry the lineage of
    the step resumed from, so the resumed run's own older steps still rotate."""
    from jaxtrain.checkpoint.registry import for_step_dir

    elsewhere, root = elsewhere(fmt), tmp_path / 'ck'
    run(files, root, fmt, num_iteration=2, save_steps=2)  # another run's committed step 2
    before = sorted(p.name for p in (root / 'checkpoint_step_000002').rglob('*'))
    out = run(
        files,
        root,
        fmt,
        num_iteration=6,
        save_steps=1,
        max_checkpoint_keep=1,
        resume_from=str(elsewhere / 'checkpoint_step_000004'),
    )
    assert 'steps [2] were not written by this run or the runs it resumed from' in out
    names = sorted(p.name for p in root.iterdir() if layout.step_of(p) is not None)
    assert names == ['checkpoint_step_000002', 'checkpoint_step_000006']
    assert sorted(p.name for p in (root / 'checkpoint_step_000002').rglob('*')) == before
    lineage = [
        for_step_dir(d).read_record(d)['lineage']
        for d in (elsewhere / 'checkpoint_step_000004', root / 'checkpoint_step_000006')
    ]
    assert (
        lineage[0]
        == lineage[1]
        != for_step_dir(root / 'checkpoint_step_000002').read_record(root / 'checkpoint_step_000002')[
            'lineage'
        ]
    )
