"""The step and [CKPT] lines are InfiniTrain's, byte for byte.

The expectations are real lines written by the InfiniTrain binary (b24d92f, in
/work/shared/infinitrain, skipped where that folder is absent): their numbers are fed to our
formatter and the text must come back unchanged. Upstream's compare scripts' regexes
(scripts/compare_loss.py and compare_tps.py at b24d92f, re-implemented here) must read it.
"""

import re
from pathlib import Path

import pytest

from jaxtrain.checkpoint import ckpt_text
from jaxtrain.train import run_log

SHARED = Path(__file__).resolve().parents[3] / 'shared' / 'infinitrain'
if not SHARED.is_dir():
    SHARED = Path('/work/shared/infinitrain')
GLOG_PREFIX = re.compile(r'^[IWEF]\d{8} [\d:.]+ +\d+ [\w.]+:\d+\] ')
# Upstream's step line, as its regex-free reader would split it: every field captured.
STEP_FIELDS = re.compile(
    r'^step +(\d+)/(\d+) \| train loss ([\d.]+) \| lr ([\d.e+-]+) \| \(([\d.]+) ms \| (\d+) tok/s \| '
    r'peak used: +(\d+) MB \| peak reserved: +(\d+) MB, DP=(\d+), TP=(\d+), SP=(\d+), PP=(\d+)\)$'
)
COMPARE_LOSS = re.compile(r'step\s+(\d+)/\d+\s+\|\s+train loss\s+([\d.]+)')  # compare_loss.py
COMPARE_TPS = re.compile(r'step\s+(\d+)/\d+.*?\|\s+(\d+)\s+tok/s')  # compare_tps.py


def _real_lines(folder: str, log: str, marker: str) -> list[str]:
    path = SHARED / folder / log
    if not path.is_file():
        pytest.skip(f'{path} is not here')
    return [GLOG_PREFIX.sub('', line.rstrip('\n')) for line in path.open() if marker in line]


@pytest.mark.parametrize('folder', ['head-gpt2', 'head-llama3'])
def test_the_step_line_is_upstreams_byte_for_byte(folder):
    lines = _real_lines(folder, 'a.log', '| train loss')
    assert len(lines) == 20
    for line in lines:
        step, total, loss, lr, ms, tps, used, reserved, dp, tp, sp, pp = STEP_FIELDS.match(line).groups()
        # The seconds that format back to the printed ms and tok/s (both from one duration).
        seconds = float(ms) / 1e3
        tokens = round(int(tps) * seconds)
        sizes = {'DP': int(dp), 'TP': int(tp), 'SP': int(sp), 'PP': int(pp)}
        ours = run_log.step_line(
            int(step), int(total), float(loss), float(lr), seconds, tokens, sizes, (int(used), int(reserved))
        )
        # tok/s is recomputed from the rounded ms: compare it within its rounding, the rest exactly.
        head, ours_tps, tail = re.split(r'\| (\d+) tok/s', ours)
        assert head + tail == re.sub(r'\| \d+ tok/s', '', line)
        assert abs(int(ours_tps) - int(tps)) <= max(2, int(tps) * 0.01)


def test_the_step_line_with_gpu_sized_numbers():
    sizes = {'DP': 8, 'TP': 2, 'SP': 2, 'PP': 1}
    line = run_log.step_line(7, 100, 3.25, 6e-4, 0.123456, 524288, sizes, (81234, 95000))
    assert line == (
        'step    7/100 | train loss 3.250000 | lr 6.00e-04 | (123.46 ms | 4246760 tok/s | '
        'peak used: 81234 MB | peak reserved: 95000 MB, DP=8, TP=2, SP=2, PP=1)'
    )
    assert COMPARE_LOSS.search(line).groups() == ('7', '3.250000')
    assert COMPARE_TPS.search(line).groups() == ('7', '4246760')


def test_the_ckpt_lines_are_upstreams():
    saves = _real_lines('head-gpt2', 'a.log', '[CKPT] Save')
    assert saves[:2] == [
        ckpt_text.ckpt_save_begin_line('a/checkpoint_step_000005', 5),
        ckpt_text.ckpt_save_done_line('a/checkpoint_step_000005'),
    ]
    loads = _real_lines('head-gpt2', 'b.log', '[CKPT] Load done')
    # Our trainer state at step 10 of that run: 10 windows of 2 x 64 tokens, lr 0.01, one device.
    state = {
        'step': 10,
        'data_position': 10,
        'tokens_per_step': 128,
        'learning_rate': 0.01,
        'training_config': {'batch_size': 2, 'sequence_length': 64},
        'topology': {'mesh': {'data': 1, 'fsdp': 1, 'tensor': 1}},
    }
    assert loads == [ckpt_text.ckpt_load_done_line(state)]
    # C++ ostream's default format of the lr; consumed batches of 2 x 64 across ranks and
    # micro-steps: 3 steps of 2048 tokens = 48.
    state.update(learning_rate=1e-5, data_position=3, tokens_per_step=4 * 64 * 4 * 2)
    state['topology']['mesh'] = {'data': 2, 'fsdp': 2, 'tensor': 2}
    assert ckpt_text.ckpt_load_done_line(state).endswith(
        'consumed_batches =48, last_lr=1e-05, topology(ddp,tp,sp,pp)=(4,2,1,1)'
    )


def test_load_done_prints_the_checkpoints_pipeline_and_sequence_parallel_sizes():
    # Upstream prints the loaded trainer_state's sizes (checkpoint.cc:106-109): ours from our record ...
    state = {
        'step': 4,
        'data_position': 4,
        'tokens_per_step': 256,
        'learning_rate': 0.01,
        'training_config': {'batch_size': 2, 'sequence_length': 64, 'sequence_parallel': True},
        'topology': {'mesh': {'data': 1, 'fsdp': 1, 'tensor': 2}, 'pp_size': 2},
    }
    assert ckpt_text.ckpt_load_done_line(state).endswith('topology(ddp,tp,sp,pp)=(1,2,2,2)')
    # ... an InfiniTrain file's from the file, with cp between sp and pp when it has one
    # (feat/context_parallel abce8d2 checkpoint.cc: "topology(ddp,tp,sp,cp,pp)=(").
    state['infinitrain_sizes'] = {'ddp': 2, 'tp': 1, 'sp': 1, 'cp': None, 'pp': 4}
    assert ckpt_text.ckpt_load_done_line(state).endswith('topology(ddp,tp,sp,pp)=(2,1,1,4)')
    state['infinitrain_sizes']['cp'] = 2
    assert ckpt_text.ckpt_load_done_line(state).endswith('topology(ddp,tp,sp,cp,pp)=(2,1,1,2,4)')
