"""Context-parallel InfiniTrain step directories (branch feat/context_parallel d03ba16): the real files
of a CPU build of d03ba16 (tests/fixtures/infinitrain_cp, one rank), the trainer state of the
generation that merges PR 151 and PR 181, `ckpt export --cp` and the other ckpt commands
on its rank directories, and a CP 2 × DP 2 × TP 2 ZeRO-1 layout written from a run on 8 fake devices,
read back bit for bit and resumed. The rank layout itself is held against a writer that follows
upstream's code in tests/checkpoint/test_infinitrain_topologies.py (its cp topologies)."""

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
from infinitrain_samples import SAMPLES, needs_samples, unpacked

from jaxtrain.checkpoint.ckpt_text import ckpt_load_done_line
from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.train.run_log import step_line
from llmc_io.infinitrain.state import read_trainer_state, render_trainer_state
from llmc_io.infinitrain.topology import Topology
from llmc_io.tensors import tree_leaves
from trainer_runs import random_shard, tiny_llmc_model, train_named


REAL = Path(__file__).resolve().parents[1] / 'fixtures' / 'infinitrain_cp'
STEP_LINE = re.compile(r'main\.cc:\d+\] (step .*)$')


def test_the_d03ba16_binary_s_trainer_state_and_load_line_are_ours(tmp_path):
    for step_dir in ('a/checkpoint_step_000010', 'a/checkpoint_step_000020', 'b/checkpoint_step_000020'):
        path = REAL / step_dir / 'trainer_state.json'
        state = read_trainer_state(path)
        assert (state.generation, state.cp_size, state.notices) == (
            'head',
            1,
            [],
        )  # valid JSON, cp_size at CP 1
        assert render_trainer_state(state).encode() == path.read_bytes()
    # (b) resumed a/checkpoint_step_000010: upstream prints the loaded state's sizes, cp included
    loaded = read_trainer_state(REAL / 'a/checkpoint_step_000010/trainer_state.json')
    record = {
        'step': loaded.global_step,
        'data_position': loaded.data_batch_idx,
        'tokens_per_step': 128,
        'training_config': {'batch_size': 2, 'sequence_length': 64},
        'learning_rate': loaded.last_lr,
        'infinitrain_sizes': {'ddp': 1, 'tp': 1, 'sp': 1, 'cp': loaded.cp_size, 'pp': 1},
    }
    theirs = [
        line.split('] ', 1)[1] for line in (REAL / 'b.log').read_text().splitlines() if 'Load done' in line
    ]
    assert theirs == [ckpt_load_done_line(record)]


def test_the_d03ba16_step_lines_are_ours_with_cp():
    lines = [m.group(1) for m in map(STEP_LINE.search, (REAL / 'a.log').read_text().splitlines()) if m]
    assert len(lines) == 20
    for line in lines:
        step, loss, lr, ms, tps = re.match(
            r'step +(\d+)/20 \| train loss (\S+) \| lr (\S+) \| \((\S+) ms \| (\d+) tok/s', line
        ).groups()
        sizes = {'DP': 1, 'TP': 1, 'SP': 1, 'CP': 2, 'PP': 1}  # ours prints CP only when it is > 1
        ours = step_line(int(step), 20, float(loss), float(lr), float(ms) / 1e3, 128, sizes, (0, 0))
        assert re.sub(r'\d+ tok/s', 'T', ours) == re.sub(r'\d+ tok/s', 'T', line.replace('CP=1', 'CP=2'))
    # the ranks of (c)'s CP group, as the binary printed its layout before it aborted (no CPU collectives)
    log = (REAL / 'c.log').read_text()
    assert 'order: {TP -> CP -> DP -> PP}' in log and '- CP 0 (dp=0, tp=0, cp=-, pp=0): [0, 1]' in log
    assert [Topology(cp=2).rank_of(0, 0, 0, cp) for cp in range(2)] == [0, 1]


@needs_samples
def test_the_d03ba16_binary_writes_head_s_model_files_and_losses_at_cp_1():
    recorded = dict(reversed(line.split()) for line in (REAL / 'md5.txt').read_text().splitlines())
    for step_dir in ('a/checkpoint_step_000010', 'a/checkpoint_step_000020', 'b/checkpoint_step_000020'):
        head = hashlib.md5((SAMPLES / 'head-gpt2' / step_dir / 'model.ckpt').read_bytes()).hexdigest()
        assert recorded[f'{step_dir}/model.ckpt'] == head
    loss = re.compile(r'step +(\d+)/20 \| train loss (\S+)')
    for log in ('a.log', 'b.log'):
        ours = [m.groups() for m in map(loss.search, (REAL / log).read_text().splitlines()) if m]
        head = [
            m.groups() for m in map(loss.search, (SAMPLES / 'head-gpt2' / log).read_text().splitlines()) if m
        ]
        assert ours == head and len(ours) == (20 if log == 'a.log' else 10)


def test_the_merged_pr151_and_pr181_trainer_state_round_trips(tmp_path):
    # SaveTrainerState of PR 151 (a7949ac0 checkpoint.cc:315-333: no last_lr, the comma after vocab_size)
    # with PR 181's cp_size line after sp_size (d03ba16 checkpoint.cc:196): both PRs edit these lines.
    text = (
        '{\n  "n_layer": 12,\n  "n_head": 12,\n  "n_kv_head": 12,\n  "n_embd": 768,\n  "vocab_size": 50304,\n'
        '  "global_step": 20,\n  "consumed_batches": 40,\n  "ddp_size": 2,\n  "tp_size": 2,\n'
        '  "sp_size": 1,\n  "cp_size": 2,\n  "pp_size": 1\n}\n'
    )
    path = tmp_path / 'trainer_state.json'
    path.write_text(text)
    state = read_trainer_state(path)
    assert (state.generation, state.last_lr, state.cp_size, state.global_step) == ('lrs', None, 2, 20)
    assert state.notices == []  # valid JSON: nothing repaired
    assert render_trainer_state(state) == text


@pytest.fixture(scope='module')
def real():
    return unpacked()


@needs_samples
def test_ckpt_export_ls_show_verify_diff_on_a_context_parallel_layout(real, tmp_path, capsys):
    from jaxtrain.tools import ckpt

    src = real / 'pr-llama3' / 'a' / 'checkpoint_step_000010'  # the PR's model.bin carries the model shape
    out = tmp_path / 'ranks' / 'checkpoint_step_000010'
    argv = ['export', src, '--format', 'infinitrain', '--ddp', '2', '--cp', '2', '--zero_stage', '1']
    assert ckpt.main([str(a) for a in argv + ['--output', out]]) == 0, capsys.readouterr()
    printed = capsys.readouterr().out
    assert 'as 4 rank directories (ddp 2 x tp 1 x cp 2 x pp 1, ZeRO-1)' in printed
    assert '--nthread_per_process 4 --context_parallel 2 --zero_stage 1 --load' in printed
    # rank = tp + T·cp + T·C·dp: rank 1 is cp 1 of dp 0, and holds the second ZeRO shard (dp·C + cp = 1)
    states = [read_trainer_state(out / f'rank_{r:06d}' / 'trainer_state.json') for r in range(4)]
    assert [s.cp_size for s in states] == [2] * 4
    assert [s.data_batch_idx - states[0].data_batch_idx for s in states] == [0, 0, 1, 1]  # DP only
    assert ckpt.main(['ls', str(out.parent)]) == 0 and 'checkpoint_step_000010' in capsys.readouterr().out
    assert ckpt.main(['show', str(out)]) == 0 and 'cp_size' in capsys.readouterr().out
    assert ckpt.main(['diff', str(src), str(out)]) == 0 and 'identical' in capsys.readouterr().out
    assert ckpt.main(['verify', str(out)]) == 0
    assert 'weights of the 4 data- and context-parallel replicas bit-identical' in capsys.readouterr().out
    # ZeRO over CP alone is allowed (d03ba16 example/gpt2/main.cc:174 CHECKs DP x CP > 1); ZeRO-3 is not
    alone = tmp_path / 'cp' / 'checkpoint_step_000010'
    argv = ['export', src, '--format', 'infinitrain', '--cp', '2', '--zero_stage', '1', '--output', alone]
    assert ckpt.main([str(a) for a in argv]) == 0, capsys.readouterr()
    assert it.read_checkpoint(alone).topology.zero_stage == 1
    capsys.readouterr()
    with pytest.raises(SystemExit):
        ckpt.main(
            [str(a) for a in argv[:4] + ['--cp', '2', '--zero_stage', '3', '--output', tmp_path / 'z3']]
        )
    assert 'invalid choice: 3' in capsys.readouterr().err


@pytest.mark.slow
def test_a_cp2_dp2_tp2_zero1_layout_is_written_read_back_and_resumed(tmp_path):
    files = dict(
        input_bin=random_shard(tmp_path / 'train.bin'), llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin')
    )
    common = dict(
        num_iteration=4,
        save_steps=2,
        batch_size=2,
        sequence_length=32,
        total_batch_size=128,
        learning_rate=1e-3,
        checkpoint_format='infinitrain',
        num_devices=8,
        mesh_data=2,
        mesh_tensor=2,
        context_parallel=2,
        zero_stage=1,
    )
    whole, out = train_named(tmp_path, 'whole', files, common)
    assert 'DP=2, TP=2, SP=1, CP=2, PP=1)' in out
    saved = tmp_path / 'whole' / 'ck' / 'checkpoint_step_000002'
    assert read_trainer_state(saved / 'trainer_state.json').cp_size == 2

    from jaxtrain.tools import ckpt

    ranks = tmp_path / 'ranks' / 'checkpoint_step_000002'
    argv = ['export', saved, '--format', 'infinitrain', '--ddp', '2', '--tp', '2', '--cp', '2']
    assert ckpt.main([str(a) for a in argv + ['--zero_stage', '1', '--output', ranks]]) == 0
    assert len(list(ranks.glob('rank_*'))) == 8
    ours, back = it.read_checkpoint(saved), it.read_checkpoint(ranks)
    for a, b in [(ours.params, back.params), *zip(ours.moments[:2], back.moments[:2], strict=True)]:
        a, b = tree_leaves(a), tree_leaves(b)
        assert a.keys() == b.keys()
        assert all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a)
    assert back.moments[2] == ours.moments[2] and back.topology.cp == 2 and back.topology.zero_stage == 1

    resumed, out = train_named(tmp_path, 'resumed', files, common, resume_from=str(ranks))
    assert sorted(resumed) == [3, 4] and all(resumed[s] == whole[s] for s in (3, 4))
    assert 'topology(ddp,tp,sp,cp,pp)=(2,2,1,2,1)' in out
    # onto CP 1: laid out again, with a notice naming upstream's CHECK
    other = dict(common, num_devices=4, context_parallel=1)
    moved, out = train_named(tmp_path, 'moved', files, other, resume_from=str(ranks))
    assert 'saved with context parallel size 2, this run has 1' in out and 'CHECK_EQ of cp_size' in out
    assert all(abs(moved[s] - whole[s]) <= 1e-5 for s in (3, 4))
