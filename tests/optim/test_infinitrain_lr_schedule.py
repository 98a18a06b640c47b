"""InfiniTrain's LR schedulers (PR 151) replayed in float32: against the real binary's logs and
lr_scheduler.ckpt files (../shared/infinitrain/lrs-*), upstream's own unit-test values
(a7949ac0 tests/optimizer/test_lr_scheduler.cc), and a float64 reference of each formula."""

import math
import re

import numpy as np
import pytest
from infinitrain_samples import SAMPLES, needs_samples

from jaxtrain.optim.infinitrain_lr_schedule import ScheduleError, ScheduleSpec, learning_rates, state_at
from llmc_io.infinitrain.lr_scheduler import read_lr_scheduler, render_lr_scheduler

STEP_LR = re.compile(r'step +(\d+)/\d+ \| train loss [\d.]+ \| lr (\S+) ')
# The flags of each run, from the folders' commands.txt.
RUNS = {
    'lrs-gpt2/a': ScheduleSpec(
        'cosine', 0.1, min_lr=0.001, warmup_iters=5, warmup_init=0.001, decay_iters=20
    ),
    'lrs-gpt2/b': ScheduleSpec(
        'cosine', 0.1, min_lr=0.001, warmup_iters=5, warmup_init=0.001, decay_iters=20
    ),
    'lrs-gpt2/l': ScheduleSpec('linear', 0.1, min_lr=0.01, decay_iters=20),
    'lrs-gpt2/n': ScheduleSpec('none', 0.1, decay_iters=10),
    'lrs-llama3/a': ScheduleSpec(
        'linear', 0.01, min_lr=0.001, warmup_iters=4, warmup_init=0.001, decay_iters=20
    ),
    'lrs-llama3/b': ScheduleSpec(
        'linear', 0.01, min_lr=0.001, warmup_iters=4, warmup_init=0.001, decay_iters=20
    ),
}


def _lr_column(log) -> dict[int, str]:
    return {int(m[1]): m[2] for m in map(STEP_LR.search, log.read_text().splitlines()) if m}


@needs_samples
@pytest.mark.parametrize('run', ['lrs-gpt2/a', 'lrs-gpt2/l', 'lrs-gpt2/n', 'lrs-llama3/a'])
def test_the_lr_column_equals_the_binarys_digit_for_digit(run):
    column = _lr_column(SAMPLES / f'{run}.log')
    assert sorted(column) == list(range(1, len(column) + 1)) and len(column) >= 10
    table = learning_rates(RUNS[run], len(column))
    # main.cc prints std::format("{:.2e}", the optimizer's float lr).
    assert {k + 1: f'{float(lr):.2e}' for k, lr in enumerate(table)} == column


@needs_samples
@pytest.mark.parametrize('run', sorted(RUNS))
def test_saved_states_equal_the_binarys_files_byte_for_byte(run):
    files = sorted((SAMPLES / run).glob('checkpoint_*/lr_scheduler.ckpt'))
    if RUNS[run].style == 'none':
        assert not files and (SAMPLES / run / 'checkpoint_step_000010' / 'model.ckpt').is_file()
        assert state_at(RUNS[run], 10) is None
        return
    assert files
    for path in files:
        step = read_lr_scheduler(path)['last_step']
        assert render_lr_scheduler(state_at(RUNS[run], step)) == path.read_bytes(), path


@needs_samples
def test_resuming_from_the_file_continues_as_b_log():
    """b.log's steps 11-20: the table continued from a's step-10 file, as LoadState + Step() do."""
    for folder in ('lrs-gpt2', 'lrs-llama3'):
        saved = read_lr_scheduler(SAMPLES / folder / 'a/checkpoint_step_000010/lr_scheduler.ckpt')
        table = learning_rates(RUNS[f'{folder}/b'], 20, saved_state=saved, saved_step=10)
        column = _lr_column(SAMPLES / folder / 'b.log')
        assert sorted(column) == list(range(11, 21))
        assert {k + 1: f'{float(table[k]):.2e}' for k in range(10, 20)} == column
        assert table[10] == saved['recover_lr']


def test_upstreams_own_unit_test_values():
    """TrainingSchedulerFactoryBuildsCommonDecayStyles: GetLR() after construction, then after each Step()."""
    cases = [
        (ScheduleSpec('constant', 0.1, decay_iters=10), [0.1, 0.1, 0.1, 0.1], 1e-6),
        (
            ScheduleSpec('linear', 1.0, min_lr=0.1, warmup_iters=2, decay_iters=6),
            [0.0, 0.5, 1.0, 0.775, 0.55, 0.325, 0.1],
            1e-6,
        ),
        (ScheduleSpec('cosine', 1.0, decay_iters=4), [1.0, 0.853553, 0.5, 0.146447, 0.0], 1e-5),
        (
            ScheduleSpec('inverse-square-root', 1.0, min_lr=0.1, warmup_iters=2, decay_iters=10),
            [0.0, 0.5, 1.0, 0.8164966, 0.7071068, 0.6324555],
            1e-5,
        ),
    ]
    for spec, expected, eps in cases:
        np.testing.assert_allclose(
            learning_rates(spec, len(expected)), expected, atol=eps, err_msg=spec.style
        )


def _float64_reference(spec: ScheduleSpec, step: int) -> float:
    """Megatron-style formulas of lr_scheduler.cc's CreateLRScheduler, in float64."""
    lr, low, warm, decay = spec.lr, spec.min_lr, spec.warmup_iters, spec.decay_iters
    if step < warm:
        return spec.warmup_init + (lr - spec.warmup_init) * step / warm
    k, span = step - warm, decay - warm
    if spec.style == 'constant':
        return lr
    if spec.style == 'linear':
        return lr + (low - lr) * min(k, span) / span
    if spec.style == 'cosine':
        return low if k > span else low + 0.5 * (math.cos(math.pi * k / span) + 1) * (lr - low)
    return low if step > decay else max(low, lr * math.sqrt(max(warm, 1)) / math.sqrt(max(step, 1)))


@pytest.mark.parametrize('style', ['constant', 'linear', 'cosine', 'inverse-square-root'])
@pytest.mark.parametrize('warmup', [0, 7])
def test_every_style_is_its_formula_to_float32_rounding(style, warmup):
    spec = ScheduleSpec(style, 3e-4, min_lr=3e-5, warmup_iters=warmup, warmup_init=1e-5, decay_iters=60)
    table = learning_rates(spec, 80)
    assert table.dtype == np.float32
    expected = np.array([_float64_reference(spec, k) for k in range(80)])
    # The chained linear accumulates one rounding per step; the closed forms stay within a few ulps.
    np.testing.assert_allclose(table, expected, rtol=2e-6 if style != 'linear' else 2e-5, atol=1e-12)


@pytest.mark.parametrize(
    'spec, message',
    [
        (ScheduleSpec('cubic', 0.1), "lr_decay_style: expected one of none | constant"),
        (ScheduleSpec('cosine', 0.1, min_lr=0.2), 'min_lr: expected <= learning_rate 0.1, found 0.2'),
        (ScheduleSpec('cosine', 0.1, min_lr=-1), 'min_lr: expected >= 0, found -1'),
        (ScheduleSpec('linear', 0.1, warmup_init=0.5), 'lr_warmup_init: expected <= learning_rate 0.1'),
        (ScheduleSpec('linear', 0.1, warmup_init=-0.5), 'lr_warmup_init: expected >= 0'),
        (ScheduleSpec('linear', 0.1, warmup_iters=-1), 'lr_warmup_iters: expected >= 0'),
        (
            ScheduleSpec('linear', 0.1, warmup_iters=10, decay_iters=10),
            'lr_warmup_iters: expected < lr_decay_iters 10',
        ),
        (ScheduleSpec('linear', 0.1, decay_iters=0), 'lr_decay_iters: expected > 0'),
        (ScheduleSpec('constant', 0.0), 'learning_rate: expected > 0 with a decay style, found 0.0'),
    ],
)
def test_upstreams_checks_refuse_on_one_line(spec, message):
    with pytest.raises(ScheduleError) as error:
        learning_rates(spec, 3)
    assert str(error.value).startswith(message) and '\n' not in str(error.value)


def test_style_none_is_the_constant_learning_rate_even_when_upstream_would_refuse_the_rest():
    # CreateLRScheduler returns nullptr for 'none' before any CHECK.
    assert learning_rates(ScheduleSpec('none', 0.25, min_lr=5.0), 3).tolist() == [0.25] * 3


def test_a_kept_replay_gives_what_a_fresh_one_gives_in_any_order():
    """The save path keeps one Replay per run; asked for steps out of order (a resume, a re-save) it
    must still give each step's own state, with or without a loaded file."""
    from jaxtrain.optim.infinitrain_lr_schedule import Replay

    spec = ScheduleSpec('linear', 1e-3, min_lr=1e-4, warmup_iters=3, warmup_init=1e-4, decay_iters=12)
    saved = state_at(spec, 5)
    saved = dict(saved, recover_lr=np.float32(saved['recover_lr'] * np.float32(1.5)))  # a file to continue
    for loaded in (None, saved):
        replay = Replay(spec, saved_state=loaded, saved_step=5)
        for step in (0, 4, 5, 9, 2, 12, 12, 7):
            fresh = state_at(spec, step, saved_state=loaded, saved_step=5)
            assert replay.state_at(step) == fresh, (loaded is None, step)
    table = learning_rates(spec, 12, saved_state=saved, saved_step=5)
    assert table[5] == saved['recover_lr'] and table[4] == learning_rates(spec, 5)[4]
