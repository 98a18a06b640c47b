"""Resuming an InfiniTrain-format step directory that jaxtrain wrote checks what it recorded, as an
Orbax resume does: the digest of every file (llmc_io/piece_digest.py), the digest of the
"jaxtrain" record, the record's step against global_step and against the directory's name. An
edited weight, global_step or data position is refused in one line naming the file and field;
`ckpt verify` reports the same problems. Before, a weight set to 1000.0 resumed silently with other
losses, and an edited global_step ended the run a step early."""

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_runs import run_cli
from piece_digests import piece_digest
from trainer_runs import random_shard, tiny_llmc_model

from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.trainer_state import with_digest
from jaxtrain.tools import ckpt
from llmc_io.infinitrain.statedict import read_state_dict, write_state_dict

pytestmark = pytest.mark.slow  # the trainer, in this process


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """A run's step 2 (InfiniTrain HEAD files), and the command line that resumes it."""
    root = tmp_path_factory.mktemp('run')
    files = ['--input_bin', random_shard(root / 'train.bin')]
    files += ['--llmc_filepath', tiny_llmc_model(root / 'm.bin')]
    common = [*files, '--sample_every', 0, '--checkpoint_format', 'infinitrain', '--save_steps', 2]
    first = run_cli(*common, '--num_iteration', 2, '--checkpoint_dir', root / 'ck')
    assert first.code == 0, first.err
    return root / 'ck' / 'checkpoint_step_000002', common


def copy(saved, tmp_path):
    step_dir = tmp_path / 'ck' / 'checkpoint_step_000002'
    shutil.copytree(saved[0], step_dir)
    return step_dir


def edit_state(step_dir, edit):
    path = step_dir / it.TRAINER_STATE
    text = path.read_text()
    path.write_text(edit(text))


def resume(saved, step_dir, num_iteration):
    args = ['--num_iteration', num_iteration, '--checkpoint_dir', step_dir.parent, '--resume_from', 'latest']
    return run_cli(*saved[1], *args)


def resume_refused(saved, step_dir) -> str:
    result = resume(saved, step_dir, 4)
    assert result.code == 1, result.out + result.err
    assert len(result.error_lines) == 1 and not [x for x in result.out.splitlines() if x.startswith('step ')]
    return result.error_lines[0]


def verify_problems(step_dir, capsys) -> str:
    capsys.readouterr()
    assert ckpt.main(['verify', str(step_dir)]) == 1
    return capsys.readouterr().out


def test_a_weight_edited_in_model_ckpt_is_refused(saved, tmp_path, capsys):
    step_dir = copy(saved, tmp_path)
    tensors = read_state_dict(step_dir / 'model.ckpt')
    name = 'transformer.h.0.ln_1.weight'
    weight = np.array(tensors[name].array)
    weight.reshape(-1)[0] = 1000.0
    tensors[name] = dataclasses.replace(tensors[name], array=weight)
    write_state_dict(step_dir / 'model.ckpt', tensors)
    line = resume_refused(saved, step_dir)
    assert f'{step_dir / "model.ckpt"}: sha256_of_64MiB_pieces: expected ' in line
    assert 'recorded by jaxtrain' in line
    assert 'model.ckpt: sha256' in verify_problems(step_dir, capsys)


def _with_whole_file_sha256s(step_dir):
    """The step's record as jaxtrain wrote it before the piece digests: one sha256 over each whole
    file, as 'sha256'."""
    path = step_dir / it.TRAINER_STATE
    state = json.loads(path.read_text())
    record = {k: v for k, v in state['jaxtrain'].items() if k not in (it.FILE_DIGESTS, 'record_sha256')}
    files = state['jaxtrain'][it.FILE_DIGESTS]
    record['sha256'] = {name: hashlib.sha256((step_dir / name).read_bytes()).hexdigest() for name in files}
    state['jaxtrain'] = with_digest(record)
    path.write_text(json.dumps(state))
    return step_dir


def test_a_record_of_whole_file_sha256s_is_still_checked(saved, tmp_path, capsys):
    step_dir = _with_whole_file_sha256s(copy(saved, tmp_path))
    assert ckpt.main(['verify', str(step_dir)]) == 0
    assert 'sha256 of 2 files as recorded' in capsys.readouterr().out
    tensors = read_state_dict(step_dir / 'optimizer.ckpt')
    name = next(iter(tensors))
    edited = np.array(tensors[name].array)
    edited.reshape(-1)[0] += 1.0
    write_state_dict(
        step_dir / 'optimizer.ckpt', {**tensors, name: dataclasses.replace(tensors[name], array=edited)}
    )
    assert f'{step_dir / "optimizer.ckpt"}: sha256: expected ' in resume_refused(saved, step_dir)
    assert 'optimizer.ckpt: sha256: expected' in verify_problems(step_dir, capsys)


def test_a_record_of_whole_file_sha256s_resumes(saved, tmp_path):
    step_dir = _with_whole_file_sha256s(copy(saved, tmp_path))
    result = resume(saved, step_dir, 3)
    assert result.code == 0 and 'restored step 2' in result.out, result.err


def test_an_edited_global_step_is_refused(saved, tmp_path, capsys):
    step_dir = copy(saved, tmp_path)
    edit_state(step_dir, lambda text: text.replace('"global_step": 2', '"global_step": 3', 1))
    line = resume_refused(saved, step_dir)
    assert f'{step_dir / it.TRAINER_STATE}: global_step: expected 2' in line
    assert 'global_step: expected 2' in verify_problems(step_dir, capsys)


def test_an_edited_data_position_is_refused(saved, tmp_path, capsys):
    step_dir = copy(saved, tmp_path)
    before = json.loads((step_dir / it.TRAINER_STATE).read_text())['jaxtrain']['data_position']
    edited = f'"data_position": {before + 5}'
    edit_state(step_dir, lambda text: text.replace(f'"data_position": {before}', edited))
    line = resume_refused(saved, step_dir)
    assert f'{step_dir / it.TRAINER_STATE}: jaxtrain.record_sha256: expected the digest' in line
    assert 'record_sha256' in verify_problems(step_dir, capsys)


def test_a_removed_digest_is_refused(saved, tmp_path, capsys):
    step_dir = copy(saved, tmp_path)
    state = json.loads((step_dir / it.TRAINER_STATE).read_text())
    del state['jaxtrain']['record_sha256']
    state['jaxtrain']['data_position'] += 5
    (step_dir / it.TRAINER_STATE).write_text(json.dumps(state))
    line = resume_refused(saved, step_dir)
    assert 'jaxtrain.record_sha256: expected the digest jaxtrain writes into every record, found none' in line
    assert 'found none' in verify_problems(step_dir, capsys)


def test_the_unedited_copy_resumes_and_verifies(saved, tmp_path, capsys):
    step_dir = copy(saved, tmp_path)
    assert ckpt.main(['verify', str(step_dir)]) == 0
    out = capsys.readouterr().out
    assert 'the jaxtrain record matches its record_sha256' in out
    assert 'sha256_of_64MiB_pieces of 2 files as recorded' in out  # model.ckpt, optimizer.ckpt
    result = resume(saved, step_dir, 3)
    assert result.code == 0 and 'restored step 2' in result.out, result.err


def test_a_resume_reads_each_file_once(saved, tmp_path, monkeypatch):
    # The read that restores the arrays also takes the files' digests; neither the recorded-digest
    # check nor verify's checks read model.ckpt or optimizer.ckpt again.
    from jaxtrain.checkpoint.formats.infinitrain import inspection
    from llmc_io.infinitrain import statedict

    step_dir = copy(saved, tmp_path)
    opened = []
    real_open = open

    def counting_open(file, *args, **kwargs):
        if str(file).endswith('.ckpt'):
            opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(statedict, 'open', counting_open, raising=False)
    monkeypatch.setattr(
        inspection, 'file_piece_digest', lambda path: opened.append(f'hashed {Path(path).name}')
    )
    result = resume(saved, step_dir, 3)
    assert result.code == 0 and 'restored step 2' in result.out, result.err
    assert sorted(opened) == ['model.ckpt', 'optimizer.ckpt']


def test_the_record_check_hashes_each_file_once_for_all_who_ask(saved, tmp_path, monkeypatch):
    # A resume checks the record and then runs verify, which checks it again: the files the first
    # hashed (a multi-rank step's other ranks, which the read does not hash) are not read twice.
    from jaxtrain.checkpoint.formats.infinitrain import inspection

    step_dir = copy(saved, tmp_path)
    hashed = []
    real = inspection.file_piece_digest
    monkeypatch.setattr(
        inspection, 'file_piece_digest', lambda path: hashed.append(Path(path).name) or real(path)
    )
    state = it.read_checkpoint(step_dir, with_optimizer=False).state
    known = {}
    for _ in range(2):
        problems, _ = inspection.recorded_problems(step_dir, step_dir, state, known)
        assert problems == []
    assert sorted(hashed) == ['model.ckpt', 'optimizer.ckpt']
    assert known == {str(step_dir / name): piece_digest((step_dir / name).read_bytes()) for name in hashed}


def test_a_field_out_of_range_with_a_recomputed_digest_is_refused(saved, tmp_path, capsys):
    step_dir = copy(saved, tmp_path)
    state = json.loads((step_dir / it.TRAINER_STATE).read_text())
    record = {k: v for k, v in state['jaxtrain'].items() if k != 'record_sha256'}
    state['jaxtrain'] = with_digest(dict(record, data_position=2**40))  # digest right, field not
    (step_dir / it.TRAINER_STATE).write_text(json.dumps(state))
    line = resume_refused(saved, step_dir)
    assert f'{step_dir / it.TRAINER_STATE}: jaxtrain.data_position: expected an integer in [0, 2**31)' in line
    assert 'jaxtrain.data_position' in verify_problems(step_dir, capsys)
