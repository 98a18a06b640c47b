"""`python -m jaxtrain.ckpt` on llm.c run folders (kind llmc): ls, show, verify on the files llm.c's
train_gpt2cu wrote (tests/fixtures/llmc_run), and export --format llmc-run checked against them."""

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from trainer_runs import train

from jaxtrain.tools import ckpt
from llmc_io import llmc_run
from llmc_io.llmc_state import read_state

RUN = Path(__file__).resolve().parents[1] / 'fixtures' / 'llmc_run'
N = 628_480


def run_tool(capsys, *argv):
    code = ckpt.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_ls_lists_committed_steps_with_llmc_losses(capsys):
    code, out, _ = run_tool(capsys, 'ls', RUN / 'a', '--json')
    listed = json.loads(out)
    assert code == 0 and listed['kind'] == 'llmc' and listed['latest'] == 20
    assert [(r['step'], r['state'], r['master_weights']) for r in listed['steps']] == [
        (10, 'committed', True),
        (20, 'committed', True),
    ]
    # main.log's "s:9 trl:8.2171" is step 10's loss, the one stdout prints as "step 10/20 | loss 8.217143".
    assert [r['loss'] for r in listed['steps']] == [8.2171, 6.972]


def test_ls_marks_a_step_without_done(tmp_path, capsys):
    run = tmp_path / 'run'
    shutil.copytree(RUN / 'a', run)
    (run / 'DONE_00000020').unlink()
    code, out, _ = run_tool(capsys, 'ls', run)
    assert code == 0
    row20 = next(line for line in out.splitlines() if line.startswith('20 '))
    assert 'no DONE marker' in row20 and 'latest' not in row20
    assert '(step 10)' in out


def test_show_prints_the_state_header(capsys):
    code, out, _ = run_tool(capsys, 'show', RUN / 'a' / 'model_00000010.bin', '--json')
    shown = json.loads(out)
    raw = np.fromfile(RUN / 'a' / 'state_00000010_00000.bin', '<i4', count=256)
    u64 = lambda slot: struct.unpack('<Q', raw[slot : slot + 2].tobytes())[0]
    assert code == 0 and shown['kind'] == 'llmc' and shown['step'] == 10
    assert shown['state']['rng_state'] == u64(20) and shown['state']['master_weights'] is True
    assert (shown['loader']['current_shard_idx'], shown['loader']['current_sample_idx']) == (1, 5)
    assert shown['loader']['shard_indices'] == [1, 0] and shown['loader']['intra_shard_indices'] == [
        1,
        3,
        2,
        4,
        0,
    ]
    assert shown['model']['version'] == 5 and shown['model']['vocab_size'] == 8192
    code, out, _ = run_tool(capsys, 'show', RUN / 'w0')  # the folder: its newest committed step
    assert code == 0 and 'absent (-w 0)' in out and 'step                 10' in out


def test_verify_passes_real_files_and_finds_damage(tmp_path, capsys):
    code, out, _ = run_tool(capsys, 'verify', RUN / 'a')
    assert code == 0 and out.startswith('OK:') and 'model = master weights rounded to bf16' in out
    run = tmp_path / 'run'
    shutil.copytree(RUN / 'a', run)
    state = run / 'state_00000020_00000.bin'
    data = bytearray(state.read_bytes())
    data[1024 + 4 * N : 1024 + 4 * N + 4] = struct.pack('<f', -1.0)  # v[0] < 0
    data[-2520 - 16 : -2520 - 12] = struct.pack('<i', 3)  # intra_shard_indices (3 4 2 0 1): [1] = 3 too
    state.write_bytes(bytes(data))
    code, out, _ = run_tool(capsys, 'verify', run)
    assert code == 1 and 'v: expected >= 0' in out and 'intra_shard_indices: expected a permutation' in out


@pytest.mark.parametrize('command', ['show', 'verify'])
def test_uncommitted_step_is_one_line_naming_the_newest(tmp_path, capsys, command):
    run = tmp_path / 'run'
    shutil.copytree(RUN / 'a', run)
    (run / 'DONE_00000020').unlink()
    code, out, err = run_tool(capsys, command, run / 'model_00000020.bin')
    assert code == 2 and out == ''
    assert len(err.strip().splitlines()) == 1 and 'the newest committed step is 10' in err


@pytest.mark.slow
def test_export_continues_llmc_state_exactly(tmp_path, capsys):
    """Resume llm.c's step 10, train to 20, export: the loader state written is byte for byte the one
    llm.c itself wrote at step 20 (same shards, same permutations, same mt19937 words)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'train'))
    from test_llmc_resume import llmc_run_config

    config = llmc_run_config(
        tmp_path,
        resume_from=str(RUN / 'a' / 'model_00000010.bin'),
        checkpoint_dir=str(tmp_path / 'ck'),
        save_steps=10,
        save_optimizer_state=True,
        dtype='bfloat16',  # the step program of test_llmc_resume.py's steps 11-20
    )
    code, _, out = train(config)
    assert code == 0, out[-2000:]
    step_dir = tmp_path / 'ck' / 'checkpoint_step_000020'
    code, out, err = run_tool(
        capsys, 'export', step_dir, '--format', 'llmc-run', '--output', tmp_path / 'llmc'
    )
    assert code == 0, err
    assert 'train_gpt2cu' in out and '-b 4 -t 64 -d 256 -y 1' in out
    ours = tmp_path / 'llmc' / 'state_00000020_00000.bin'
    theirs = RUN / 'a' / 'state_00000020_00000.bin'
    loader_bytes = 8 + 2 * 4 + 8 + 5 * 4 + 2520
    assert ours.read_bytes()[-loader_bytes:] == theirs.read_bytes()[-loader_bytes:]
    mine, llmc = read_state(ours, N), read_state(theirs, N)
    assert (mine.current_shard_idx, mine.current_sample_idx) == (
        llmc.current_shard_idx,
        llmc.current_sample_idx,
    )
    # m, v, master weights are ours: the Adam moments and fp32 parameters of the checkpoint.
    from jaxtrain.checkpoint.formats.infinitrain.inspection import canonical_tensors

    tensors = canonical_tensors(step_dir)
    step = llmc_run.read_step(tmp_path / 'llmc', 20, need_master=True)
    from llmc_io.llmc_state import flat_to_tree

    m = flat_to_tree(step.state.m, step.header)
    np.testing.assert_array_equal(m['h']['mlp']['c_fc']['kernel'], tensors['adam.m/h/mlp/c_fc/kernel'])
    master = flat_to_tree(step.state.master, step.header)
    np.testing.assert_array_equal(master['wte']['embedding'], tensors['params/wte/embedding'])
    # The data identity the step recorded goes beside the state, for our resume to check.
    from jaxtrain.checkpoint.trainer_state import read_trainer_state

    assert step.data == read_trainer_state(step_dir)['data'] and step.data['shards']
    code, out, _ = run_tool(capsys, 'verify', tmp_path / 'llmc')
    assert code == 0, out
    # Again without --force: refused, nothing touched.
    before = ours.read_bytes()
    code, out, err = run_tool(
        capsys, 'export', step_dir, '--format', 'llmc-run', '--output', tmp_path / 'llmc'
    )
    assert code == 2 and 'pass --force' in err and ours.read_bytes() == before


@pytest.mark.parametrize('fmt, output', [('llmc-run', 'run'), ('infinitrain', 'checkpoint_step_000001')])
def test_export_of_a_folder_that_is_no_checkpoint_says_so(tmp_path, capsys, fmt, output):
    (tmp_path / 'notes').mkdir()
    code = ckpt.main(['export', str(tmp_path / 'notes'), '--format', fmt, '--output', str(tmp_path / output)])
    err = capsys.readouterr().err
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert f'{tmp_path / "notes"}: expected a checkpoint_step_NNNNNN directory' in err
    assert 'found a directory that is not a checkpoint' in err and 'damaged' not in err
    assert not (tmp_path / output).exists()


def test_diff_and_export_to_other_formats_refuse_a_run_folder_with_the_convert_command(tmp_path, capsys):
    """diff and export (every --format) read Orbax and InfiniTrain steps only: one line naming
    the run folder's newest model file (its DONE_00000020) and the llmc_io command that converts it."""
    model = RUN / 'a' / 'model_00000020.bin'
    for argv, hint in (
        (['diff', RUN / 'a', model], f'python -m llmc_io convert {model} OUT,'),
        (['export', RUN / 'a', '--format', 'hf', '--output', tmp_path / 'hf'], f'{model} OUT --to hf'),
        (['export', model, '--format', 'infinitrain', '--output', tmp_path / 'checkpoint_step_000020'], ''),
        (['export', RUN / 'a', '--format', 'llmc-run', '--output', tmp_path / 'run'], ''),
    ):
        code, out, err = run_tool(capsys, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert 'found an llm.c run folder' in err and hint in err and f'--init_from {model}' in err
    assert list(tmp_path.iterdir()) == []
