"""`ckpt export` never destroys what is in the way: an existing --output is refused unless --force;
with --force only an earlier export's files are replaced, never a directory another run or person
wrote, never a checkpoint, and never the llm.c file a checkpoint records as its base. A refused
export is one line, exit 2, and every byte in the way is as it was."""

import hashlib
from pathlib import Path

import numpy as np
import pytest
from tiny_models import random_params, tiny_header
from trainer_runs import write_checkpoint

import llmc_io
from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.tools import ckpt
from llmc_io.infinitrain.state import read_trainer_state, write_trainer_state

GPT2 = tiny_header('gpt2', max_seq_len=16, vocab_size=50, padded_vocab_size=64, channels=16)


def digest(path: Path) -> str:
    files = sorted(p for p in Path(path).rglob('*') if p.is_file()) if Path(path).is_dir() else [Path(path)]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path) if Path(path).is_dir() else f.name).encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def step_dir(tmp_path):
    params = random_params(GPT2, 0, std=0.3, everywhere=True)
    params['wte']['embedding'][GPT2.vocab_size :] = 0
    llmc_io.save_gpt2(str(tmp_path / 'base.bin'), GPT2, params)
    return write_checkpoint(tmp_path / 'ck', 5, 'gpt2', GPT2, params, llmc_file=str(tmp_path / 'base.bin'))


def refused(capsys, *args) -> str:
    assert ckpt.main(['export', *map(str, args)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_an_existing_llmc_file_is_replaced_only_with_force(tmp_path, capsys, step_dir):
    out = tmp_path / 'model.bin'
    out.write_bytes(b'a file the user keeps')
    err = refused(capsys, step_dir, '--output', out)
    assert f'--output: {out}: expected a path that does not exist yet, found a file there' in err
    assert '--force' in err and out.read_bytes() == b'a file the user keeps'
    assert ckpt.main(['export', str(step_dir), '--output', str(out), '--force']) == 0
    assert llmc_io.load_gpt2(str(out))[0] == GPT2


@pytest.mark.parametrize('force', [[], ['--force']])
def test_the_recorded_base_is_never_written_over(tmp_path, capsys, step_dir, force):
    base = tmp_path / 'base.bin'
    before = digest(base)
    err = refused(capsys, step_dir, '--output', base, *force)
    assert str(base) in err and base.read_bytes() and digest(base) == before
    if force:
        assert 'records as its base (llmc_file)' in err
    # The same file under another name (a hard link) is the same base.
    (tmp_path / 'alias.bin').hardlink_to(base)
    refused(capsys, step_dir, '--output', tmp_path / 'alias.bin', '--force')
    assert digest(base) == before


def test_an_hf_folder_is_not_replaced_without_force_and_keeps_other_files(tmp_path, capsys, step_dir):
    folder = tmp_path / 'hf'
    folder.mkdir()
    (folder / 'config.json').write_text('{"mine": true}')
    (folder / 'README.md').write_text('my notes')
    err = refused(capsys, step_dir, '--format', 'hf', '--output', folder)
    assert 'expected a new or empty folder' in err
    assert (folder / 'config.json').read_text() == '{"mine": true}'
    assert not (folder / 'model.safetensors').exists()
    # --force replaces only HF files an export wrote: not a config.json of another program's.
    err = refused(capsys, step_dir, '--format', 'hf', '--output', folder, '--force')
    assert 'found config.json of another program' in err
    assert (folder / 'config.json').read_text() == '{"mine": true}'
    (folder / 'config.json').unlink()
    assert 'found one holding README.md' in refused(capsys, step_dir, '--format', 'hf', '--output', folder)
    assert ckpt.main(['export', str(step_dir), '--format', 'hf', '--output', str(folder), '--force']) == 0
    assert ckpt.main(['export', str(step_dir), '--format', 'hf', '--output', str(folder), '--force']) == 0
    assert llmc_io.hf.load_hf(folder)[0] == GPT2
    assert (folder / 'README.md').read_text() == 'my notes'
    # A checkpoint is never an HF folder, --force or not.
    err = refused(capsys, step_dir, '--format', 'hf', '--output', step_dir, '--force')
    assert 'found a checkpoint' in err


def test_an_infinitrain_step_directory_of_another_run_is_never_deleted(tmp_path, capsys, step_dir):
    theirs = tmp_path / 'other' / 'checkpoint_step_000005'
    assert ckpt.main(['export', str(step_dir), '--format', 'infinitrain', '--output', str(theirs)]) == 0
    capsys.readouterr()
    (theirs / 'notes.txt').write_text('files of theirs')  # no longer only what an export writes
    before = digest(theirs)
    for force in ([], ['--force']):
        refused(capsys, step_dir, '--format', 'infinitrain', '--output', theirs, *force)
        assert digest(theirs) == before
    # A committed step a run wrote (no exported_from in its record) is kept too.
    (theirs / 'notes.txt').unlink()
    state = read_trainer_state(theirs / it.TRAINER_STATE)
    state.jaxtrain.pop('exported_from')
    write_trainer_state(theirs / it.TRAINER_STATE, state)
    before = digest(theirs)
    err = refused(capsys, step_dir, '--format', 'infinitrain', '--output', theirs, '--force')
    assert 'ckpt export wrote and nothing else' in err and digest(theirs) == before


def test_force_replaces_an_earlier_export(tmp_path, capsys, step_dir):
    out = tmp_path / 'it' / 'checkpoint_step_000005'
    assert ckpt.main(['export', str(step_dir), '--format', 'infinitrain-bin', '--output', str(out)]) == 0
    err = refused(capsys, step_dir, '--format', 'infinitrain', '--output', out)
    assert 'pass --force to replace an earlier export' in err and it.detect_kind(out) == it.PR_BIN_KIND
    forced = ['export', str(step_dir), '--format', 'infinitrain', '--output', str(out), '--force']
    assert ckpt.main(forced) == 0
    assert it.detect_kind(out) == it.HEAD_KIND and not (out / 'model.bin').exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ['checkpoint_step_000005']  # nothing left aside
    bias = it.read_checkpoint(out).params['ln_f']['bias']
    np.testing.assert_array_equal(bias, random_params(GPT2, 0, std=0.3, everywhere=True)['ln_f']['bias'])


def test_never_a_committed_llmc_step_nor_inside_the_checkpoint_read(tmp_path, capsys, step_dir):
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    (run_dir / 'model_00000010.bin').write_bytes(b'train_gpt2cu wrote this')
    (run_dir / 'DONE_00000010').touch()
    err = refused(capsys, step_dir, '--output', run_dir / 'model_00000010.bin', '--force')
    assert 'found a file of the committed llm.c step 10 (DONE_00000010 beside it)' in err
    assert (run_dir / 'model_00000010.bin').read_bytes() == b'train_gpt2cu wrote this'
    # An InfiniTrain PR step's model.bin is that step's weights.
    theirs = tmp_path / 'it' / 'checkpoint_step_000005'
    assert ckpt.main(['export', str(step_dir), '--format', 'infinitrain-bin', '--output', str(theirs)]) == 0
    capsys.readouterr()
    it_before = digest(theirs)
    err = refused(capsys, step_dir, '--output', theirs / 'model.bin', '--force')
    assert f'found one inside the step {theirs}' in err and digest(theirs) == it_before
    before = digest(step_dir)
    (tmp_path / 'alias').symlink_to(step_dir)
    for output, fmt in (
        (tmp_path / 'alias' / 'trainer_state' / 'model.bin', 'llmc'),
        (step_dir / 'hf', 'hf'),
        (tmp_path / 'alias', 'llmc-run'),
    ):
        err = refused(capsys, step_dir, '--format', fmt, '--output', output, '--force')
        assert f'expected a path outside STEP_DIR {step_dir}, found a' in err
    assert digest(step_dir) == before


def test_version_is_refused_where_the_format_has_none(tmp_path, capsys, step_dir):
    for fmt in ('hf', 'infinitrain', 'infinitrain-bin'):
        out = tmp_path / fmt / 'checkpoint_step_000005'
        err = refused(capsys, step_dir, '--format', fmt, '--output', out, '--version', '5')
        assert err.endswith('found 5') and '--version: expected none' in err and not out.exists()


def test_what_the_run_started_from_is_never_written_over(tmp_path, capsys, step_dir):
    """An HF folder given as --init_from (recorded in training_config) is often the only copy of
    the model a run was fine-tuned from: --force never replaces its files or writes into it."""
    params = random_params(GPT2, 1, std=0.3, everywhere=True)
    params['wte']['embedding'][GPT2.vocab_size :] = 0
    hf = tmp_path / 'pretrained'
    llmc_io.hf.save_hf(hf, GPT2, params)
    before = digest(hf)
    config = {'optimizer': 'adamw', 'save_optimizer_state': False, 'init_from': str(hf)}
    tuned = write_checkpoint(tmp_path / 'tuned', 9, 'gpt2', GPT2, params, training_config=config)
    for output, fmt in ((hf, 'hf'), (hf / 'model.bin', 'llmc')):
        err = refused(capsys, tuned, '--format', fmt, '--output', output, '--force')
        assert f'what the run of {tuned} started from' in err and f'--init_from {hf}' in err
    assert digest(hf) == before
