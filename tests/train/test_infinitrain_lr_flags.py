"""InfiniTrain's five schedule flags (PR 151) on the trainer's command line: help, upstream's checks,
one spelling at a time, the two spellings of one schedule giving the same numbers, and a resume whose
lr_scheduler.ckpt is damaged or does not fit the flags refused on one line with nothing written."""

import re
import shutil

import numpy as np
import optax
import pytest
from cli_runs import run_cli, tree_digest
from infinitrain_samples import SAMPLES, sample_commands
from trainer_runs import load_config, random_shard, tiny_llmc_model

from jaxtrain.optim.optimizer import learning_rate_schedule

FLAGS = ('min_lr', 'lr_decay_style', 'lr_warmup_iters', 'lr_warmup_init', 'lr_decay_iters')
STEP_LR = re.compile(r'step +(\d+)/\d+ \| train loss ([\d.]+) \| lr (\S+) ')


def _table(config, steps):
    schedule = learning_rate_schedule(config)
    return np.array([float(schedule(k)) for k in range(steps)], np.float32)


def test_every_flag_has_help_with_its_default(capsys):
    """absl appends '(default: ...)' to any help, even an empty one: the text before it is what the
    key's author wrote (test_key_help.py checks the defaults shown against config/keys.py)."""
    result = run_cli('--helpfull')
    text = result.out + result.err
    for name in FLAGS:
        block = text[text.index(f'--{name}:') :].split('\n  --', 1)[0]
        written = ' '.join(block.split(':', 1)[1].rsplit('(default:', 1)[0].split())
        assert len(written.split()) >= 4 and ('InfiniTrain' in written or 'schedule' in written), name


@pytest.mark.parametrize(
    'overrides, expected',
    [
        ({'lr_schedule': 'constant'}, {'lr_decay_style': 'constant'}),
        ({'lr_schedule': 'cosine', 'min_lr_ratio': 0.1}, {'lr_decay_style': 'cosine', 'min_lr': 3e-4 * 0.1}),
        ({'lr_schedule': 'cosine'}, {'lr_decay_style': 'cosine', 'lr_decay_iters': 0}),
    ],
)
def test_two_spellings_of_one_schedule_give_the_same_numbers(overrides, expected):
    ours = load_config(learning_rate=3e-4, num_iteration=40, **overrides)
    theirs = load_config(learning_rate=3e-4, num_iteration=40, **expected)
    np.testing.assert_array_equal(_table(ours, 45), _table(theirs, 45))


def test_jaxtrains_cosine_is_still_optaxs_to_float32_rounding():
    """The replayed cosine (upstream's float32 order of operations) against optax's own schedule."""
    config = load_config(learning_rate=3e-4, num_iteration=40, lr_schedule='cosine', min_lr_ratio=0.1)
    reference = optax.cosine_decay_schedule(3e-4, decay_steps=40, alpha=0.1)
    # A few float32 ulps apart (eps 1.2e-7): the same schedule, rounded in another order.
    np.testing.assert_allclose(_table(config, 45), [float(reference(k)) for k in range(45)], rtol=1e-6)


def test_warmup_spellings_differ_and_both_are_kept():
    """llm.c's warmup (ours: lr·(s+1)/W) is not upstream's (init + (lr - init)·s/W): each keeps its own."""
    ours = _table(load_config(learning_rate=1.0, num_iteration=8, warmup_steps=4), 4)
    theirs = _table(load_config(learning_rate=1.0, num_iteration=8, lr_warmup_iters=4), 4)
    assert ours.tolist() == [0.25, 0.5, 0.75, 1.0] and theirs.tolist() == [0.0, 0.25, 0.5, 0.75]


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('lr_flags')
    return {
        'model': tiny_llmc_model(root / 'gpt2.bin'),
        'shard': random_shard(root / 'train.bin', num_tokens=4_000),
    }


def _train(files, *args):
    return ['--llmc_filepath', files['model'], '--input_bin', files['shard'], '--num_iteration', 6, *args]


def _one_error_line(result, *parts):
    assert result.code != 0
    assert len(result.error_lines) == 1 and 'Traceback' not in result.err, result.err
    for part in parts:
        assert part in result.error_lines[0], result.error_lines[0]


# The runs below that save or resume PR 151's files are the lrs-gpt2 sample's own runs, their flags read
# from its commands.txt (tests/train/test_infinitrain_lr_crosscheck.py compares run (a)'s losses with the
# binary's): a schedule's table is a constant of the compiled step, so they all compile that one step.
# Run (a): a warmup of 5 steps from 1e-3, then a cosine down to 1e-3 at step 20, saved every 5 steps.
SCHEDULE_FLAGS = tuple(f'--{name}' for name in FLAGS)
SAVE_FLAGS = ('--save', '--save_interval')


def _sample_flags(run: str) -> dict[str, str]:
    """Run `run` (its log's name) of the lrs-gpt2 sample as commands.txt gives it: {flag: value} (every
    flag of upstream's gpt2 binary takes one)."""
    words = sample_commands('lrs-gpt2')[run]
    return dict(zip(words[::2], words[1::2], strict=True))


def _flat(flags: dict) -> list[str]:
    return [word for pair in flags.items() for word in pair]


def _schedule(run: str) -> dict[str, str]:
    """The schedule flags of a sample run."""
    return {k: v for k, v in _sample_flags(run).items() if k in SCHEDULE_FLAGS}


def _spec(run: str):
    """The ScheduleSpec a sample run's flags spell (lr_decay_iters 0 is num_iteration, as main.cc has it)."""
    from jaxtrain.optim.infinitrain_lr_schedule import ScheduleSpec

    flags = _sample_flags(run)
    return ScheduleSpec(
        flags.get('--lr_decay_style', 'constant'),
        float(flags['--learning_rate']),
        min_lr=float(flags.get('--min_lr', 0)),
        warmup_iters=int(flags.get('--lr_warmup_iters', 0)),
        warmup_init=float(flags.get('--lr_warmup_init', 0)),
        decay_iters=int(flags.get('--lr_decay_iters', 0)) or int(flags['--num_iteration']),
    )


@pytest.fixture(scope='module')
def lrs_sample():
    """The lrs-gpt2 sample folder (its model.bin and train.bin are the runs' inputs)."""
    if not (SAMPLES / 'lrs-gpt2' / 'commands.txt').is_file():
        pytest.skip(f'{SAMPLES / "lrs-gpt2"} is not here')
    return SAMPLES / 'lrs-gpt2'


def _sample_run(sample, run: str, *args) -> list:
    """Sample run `run`'s flags less its schedule and where it saves, on the sample's files; then args."""
    flags = {k: v for k, v in _sample_flags(run).items() if k not in SCHEDULE_FLAGS + SAVE_FLAGS}
    flags.update(
        {'--llmc_filepath': sample / flags['--llmc_filepath'], '--input_bin': sample / flags['--input_bin']}
    )
    return [*_flat(flags), *args]


def _run(*args):
    """The command line as upstream's binary takes it (configs/gpt2.py:infinitrain)."""
    return run_cli(*args, config='configs/gpt2.py:infinitrain', num_devices=None)


@pytest.fixture(scope='module')
def pr151_run(lrs_sample, tmp_path_factory):
    """(root, result, command line) of run (a) saving InfiniTrain files at steps 5, 10, 15 and 20 under
    root/full, which several tests below read."""
    root = tmp_path_factory.mktemp('pr151')
    common = _sample_run(
        lrs_sample, 'a.log', '--checkpoint_format', 'infinitrain', *_flat(_schedule('a.log'))
    )
    result = _run(*common, '--checkpoint_dir', root / 'full', '--save_steps', 5)
    assert result.code == 0, result.err
    return root, result, common


def _cosine_orbax(sample) -> list:
    """Run (a) saving by default as Orbax, at steps 5, 10, 15 and 20."""
    return _sample_run(sample, 'a.log', *_flat(_schedule('a.log')), '--save_steps', 5)


@pytest.fixture(scope='module')
def cosine_orbax_run(lrs_sample, tmp_path_factory):
    """The Orbax root of one run of _cosine_orbax."""
    root = tmp_path_factory.mktemp('cosine') / 'orbax'
    result = _run(*_cosine_orbax(lrs_sample), '--checkpoint_dir', root)
    assert result.code == 0, result.err
    return root


@pytest.mark.parametrize(
    'args, parts',
    [
        (('--lr_decay_style', 'exponential'), ('lr_decay_style', 'exponential', 'cosine')),
        (('--lr_decay_style', 'cosine', '--min_lr', 1.0), ('min_lr: expected <= learning_rate',)),
        (('--lr_warmup_iters', 6), ('lr_warmup_iters: expected < lr_decay_iters 6',)),
        (('--lr_warmup_iters', 2, '--lr_warmup_init', 1.0), ('lr_warmup_init: expected <= learning_rate',)),
        (('--lr_schedule', 'cosine', '--lr_decay_style', 'linear'), ('one spelling of the schedule',)),
        (('--warmup_steps', 2, '--lr_warmup_iters', 2), ('warmup_steps 2', 'lr_warmup_iters 2')),
    ],
)
def test_bad_flags_are_one_line_and_nothing_is_written(files, tmp_path, args, parts):
    ckpt = tmp_path / 'ck'
    result = run_cli(*_train(files, '--checkpoint_dir', ckpt, '--save_steps', 2, *args))
    _one_error_line(result, *parts)
    assert not ckpt.exists()


@pytest.mark.slow  # two runs compared
def test_two_spellings_train_the_same_run(files):
    """The trainer itself: --lr_schedule cosine --min_lr_ratio 0.5 and --lr_decay_style cosine --min_lr
    (half the lr) print the same lr column and the same losses."""
    runs = [
        run_cli(*_train(files, '--learning_rate', 1e-3, '--lr_schedule', 'cosine', '--min_lr_ratio', 0.5)),
        run_cli(*_train(files, '--learning_rate', 1e-3, '--lr_decay_style', 'cosine', '--min_lr', 5e-4)),
    ]
    lines = []
    for result in runs:
        assert result.code == 0, result.err
        lines.append([m.groups() for m in map(STEP_LR.search, result.out.splitlines()) if m])
    assert len(lines[0]) == 6 and lines[0] == lines[1]
    assert lines[0][0][2] == '1.00e-03' and lines[0][-1][2] != '1.00e-03'


# --- resuming the real lrs-gpt2 step directory with a file or flags that do not fit ----------------------


@pytest.fixture
def lrs_gpt2(tmp_path, monkeypatch):
    source = SAMPLES / 'lrs-gpt2'
    if not (source / 'a').is_dir():
        pytest.skip(f'{source} is not here')
    monkeypatch.chdir(tmp_path)
    for name in ('model.bin', 'train.bin'):
        shutil.copy(source / name, name)
    shutil.copytree(source / 'a/checkpoint_step_000010', 'a/checkpoint_step_000010')
    return tmp_path


def _resume(schedule: dict):
    """Run (b) of the sample as commands.txt gives it (resuming a/checkpoint_step_000010, saving to b)
    with `schedule` in place of its schedule flags, saving InfiniTrain's files."""
    flags = {k: v for k, v in _sample_flags('b.log').items() if k not in SCHEDULE_FLAGS}
    args = [*_flat(flags), *_flat(schedule), '--checkpoint_format', 'infinitrain']
    return run_cli(*args, config='configs/gpt2.py:infinitrain', num_devices=None)


@pytest.mark.parametrize(
    'edit, parts',
    [
        (  # run (b)'s decay without its warmup
            lambda s: {k: s[k] for k in ('--lr_decay_style', '--min_lr')},
            ('entries: expected a plain scheduler (no warmup)', 'found a warmup then the decay'),
        ),
        (
            lambda s: {**s, '--lr_decay_style': 'linear'},
            ('recover_lr: expected 0.067', 'gives after step 10), found 0.07525', 'schedule flags'),
        ),
        (lambda s: {**s, '--lr_warmup_iters': '4'}, ('scheduler_0.last_step: expected 3',)),
        (
            lambda s: {'--lr_decay_style': 'none'},
            ('expected no lr_scheduler.ckpt with --lr_decay_style none',),
        ),
        (lambda s: {'--warmup_steps': '5'}, ("expected no lr_scheduler.ckpt with llm.c's warmup",)),
        (lambda s: {**s, '--lr_decay_iters': '30'}, ('recover_lr: expected', '--lr_decay_iters 30')),
    ],
    ids=['no-warmup', 'linear', 'warmup-4', 'none', 'llmc-warmup', 'decay-iters-30'],
)
def test_a_scheduler_file_that_does_not_fit_the_flags_is_refused(lrs_gpt2, edit, parts):
    """Run (b) with its schedule flags edited (`edit` of them) does not fit the file it resumes."""
    before = tree_digest(lrs_gpt2)
    result = _resume(edit(_schedule('b.log')))
    _one_error_line(result, 'a/checkpoint_step_000010/lr_scheduler.ckpt', *parts)
    assert tree_digest(lrs_gpt2) == before and not (lrs_gpt2 / 'b').exists()


@pytest.mark.parametrize(
    'damage, part',
    [
        (lambda data: b'XXXX' + data[4:], 'magic: expected 0x53524C53'),
        (lambda data: data[:4] + b'\x07' + data[5:], 'version: expected 1, found 7'),
        (lambda data: data[:37] + b'\x09' + data[38:], "entry 'scheduler_1.last_step': type byte"),
        (lambda data: data[:-5], "entry 'last_step': value: expected 8 bytes"),
        (lambda data: data[:8] + b'\xff\xff\x00\x00' + data[12:], 'entry count: expected at most'),
    ],
)
def test_a_damaged_scheduler_file_is_refused(lrs_gpt2, damage, part):
    path = lrs_gpt2 / 'a/checkpoint_step_000010/lr_scheduler.ckpt'
    path.write_bytes(damage(path.read_bytes()))
    before = tree_digest(lrs_gpt2)
    result = _resume(_schedule('b.log'))
    _one_error_line(result, 'lr_scheduler.ckpt', part)
    assert tree_digest(lrs_gpt2) == before and not (lrs_gpt2 / 'b').exists()


@pytest.mark.slow  # two runs
def test_our_lr_scheduler_generation_saves_verifies_exports_and_resumes(pr151_run, tmp_path, capsys):
    """A run with InfiniTrain's flags saving --checkpoint_format infinitrain: lr_scheduler.ckpt is the
    scheduler's state at the step (checked against the replay, whose bytes equal the binary's files);
    `ckpt verify` covers it by sha256; export to HEAD puts its lr in last_lr; a resume from step 10
    prints the uninterrupted run's steps 11-20."""
    from jaxtrain.optim.infinitrain_lr_schedule import state_at
    from jaxtrain.tools import ckpt
    from llmc_io.infinitrain.lr_scheduler import read_lr_scheduler
    from llmc_io.infinitrain.state import read_trainer_state

    run_root, full, common = pr151_run
    spec = _spec('a.log')
    for step in (5, 10, 15, 20):
        step_dir = run_root / 'full' / f'checkpoint_step_{step:06d}'
        saved = read_lr_scheduler(step_dir / 'lr_scheduler.ckpt')
        assert saved == state_at(spec, step)
        state = read_trainer_state(step_dir / 'trainer_state.json')
        assert state.generation == 'lrs' and state.last_lr is None
        assert 'lr_scheduler.ckpt' in state.jaxtrain['sha256_of_64MiB_pieces']
    step10 = run_root / 'full' / 'checkpoint_step_000010'
    assert ckpt.main(['verify', str(step10)]) == 0
    assert 'of 2 files as recorded' in capsys.readouterr().out  # model.ckpt, lr_scheduler.ckpt (SGD)
    assert (
        ckpt.main(
            [
                'export',
                str(step10),
                '--format',
                'infinitrain',
                '--output',
                str(tmp_path / 'head' / step10.name),
            ]
        )
        == 0
    )
    head = read_trainer_state(tmp_path / 'head' / step10.name / 'trainer_state.json')
    next_lr = read_lr_scheduler(step10 / 'lr_scheduler.ckpt')['recover_lr']
    assert head.generation == 'head' and head.last_lr == float(f'{next_lr:g}')  # HEAD prints %g
    resumed = _run(
        *common, '--checkpoint_dir', tmp_path / 'resumed', '--save_steps', 5, '--resume_from', step10
    )
    assert resumed.code == 0, resumed.err
    assert (
        '[CKPT] Loading LR scheduler' in resumed.out
        and 'last_lr' not in resumed.out.split('Load done')[1].split('\n')[0]
    )
    steps = lambda out: {int(m[1]): m.groups()[1:] for m in map(STEP_LR.search, out.splitlines()) if m}
    assert steps(resumed.out) == {k: v for k, v in steps(full.out).items() if k > 10}
    assert (tmp_path / 'resumed/checkpoint_step_000020/lr_scheduler.ckpt').read_bytes() == (
        run_root / 'full/checkpoint_step_000020/lr_scheduler.ckpt'
    ).read_bytes()


@pytest.mark.slow  # two runs
def test_infinitrain_lrs_names_the_generation_for_a_constant_schedule(lrs_sample, tmp_path):
    """Upstream master with no schedule flags runs a constant LambdaLR and saves it; so does
    --checkpoint_format infinitrain-lrs. Plain infinitrain stays HEAD's layout (last_lr, no file)."""
    from jaxtrain.optim.infinitrain_lr_schedule import ScheduleSpec, state_at
    from llmc_io.infinitrain.lr_scheduler import read_lr_scheduler
    from llmc_io.infinitrain.state import read_trainer_state

    # Run (n) less its --lr_decay_style none: the same constant lr, spelled by no schedule flag.
    run_n = _sample_flags('n.log')
    learning_rate, steps = float(run_n['--learning_rate']), int(run_n['--num_iteration'])
    for fmt, generation in (('infinitrain-lrs', 'lrs'), ('infinitrain', 'head')):
        root = tmp_path / fmt
        args = ('--checkpoint_dir', root, '--save_steps', 5, '--checkpoint_format', fmt)
        result = _run(*_sample_run(lrs_sample, 'n.log', *args))
        assert result.code == 0, result.err
        step_dir = root / f'checkpoint_step_{steps:06d}'
        assert read_trainer_state(step_dir / 'trainer_state.json').generation == generation
        if generation == 'lrs':
            assert read_lr_scheduler(step_dir / 'lr_scheduler.ckpt') == state_at(
                ScheduleSpec('constant', learning_rate), steps
            )
        else:
            assert not (step_dir / 'lr_scheduler.ckpt').exists()


def test_infinitrain_lrs_refuses_llmc_warmup_before_training(files, tmp_path):
    root = tmp_path / 'ck'
    result = run_cli(
        *_train(files, '--checkpoint_dir', root, '--save_steps', 3, '--checkpoint_format', 'infinitrain-lrs'),
        '--warmup_steps',
        2,
    )
    _one_error_line(result, 'infinitrain-lrs: expected a schedule InfiniTrain can run', '--lr_warmup_iters')
    assert not root.exists()


@pytest.mark.slow  # a run
def test_export_infinitrain_lrs_from_orbax_and_from_infinitrain(cosine_orbax_run, tmp_path, capsys):
    """ckpt export --format infinitrain-lrs: from an Orbax step, the scheduler state its recorded flags
    give at the step; from an InfiniTrain step, its own file, byte for byte."""
    from jaxtrain.optim.infinitrain_lr_schedule import state_at
    from jaxtrain.tools import ckpt
    from llmc_io.infinitrain.lr_scheduler import render_lr_scheduler
    from llmc_io.infinitrain.state import read_trainer_state

    spec = _spec('a.log')
    first = tmp_path / 'lrs' / 'checkpoint_step_000010'
    args = ['export', str(cosine_orbax_run / 'checkpoint_step_000010'), '--format', 'infinitrain-lrs']
    assert ckpt.main([*args, '--output', str(first)]) == 0, capsys.readouterr()
    assert (first / 'lr_scheduler.ckpt').read_bytes() == render_lr_scheduler(state_at(spec, 10))
    assert read_trainer_state(first / 'trainer_state.json').generation == 'lrs'
    second = tmp_path / 'again' / 'checkpoint_step_000010'
    assert ckpt.main(['export', str(first), '--format', 'infinitrain-lrs', '--output', str(second)]) == 0
    assert (second / 'lr_scheduler.ckpt').read_bytes() == (first / 'lr_scheduler.ckpt').read_bytes()
    assert ckpt.main(['verify', str(second)]) == 0


def test_upstreams_checks_apply_only_to_its_spelling():
    """learning_rate 0 is a valid run of ours (nothing moves); upstream's CHECK refuses it with a style."""
    from jaxtrain.checks.config_checks import check_config

    check_config(load_config(learning_rate=0.0))
    with pytest.raises(ValueError, match='learning_rate: expected > 0 with a decay style, found 0.0'):
        check_config(load_config(learning_rate=0.0, lr_decay_style='cosine'))


@pytest.mark.slow  # two runs
def test_an_orbax_resume_prints_pr_151s_load_done_line(lrs_sample, cosine_orbax_run, tmp_path):
    """The binary decides the line: with PR 151's flags `Load done` has no last_lr, whatever the source."""
    result = _run(
        *_cosine_orbax(lrs_sample),
        '--checkpoint_dir',
        tmp_path / 'resumed',
        '--resume_from',
        cosine_orbax_run / 'checkpoint_step_000010',
    )
    assert result.code == 0, result.err
    line = next(line for line in result.out.splitlines() if line.startswith('[CKPT] Load done'))
    assert line == '[CKPT] Load done: global_step=10, consumed_batches =10, topology(ddp,tp,sp,pp)=(1,1,1,1)'


@pytest.mark.slow  # a run
def test_export_infinitrain_lrs_as_rank_directories(pr151_run, tmp_path, capsys):
    """Upstream saves per rank, so every rank_NNNNNN/ of a multi-GPU export carries the same
    lr_scheduler.ckpt; reading it back takes rank 0's."""
    from jaxtrain.tools import ckpt
    from llmc_io.infinitrain.state import read_trainer_state

    source = pr151_run[0] / 'full/checkpoint_step_000010'  # a warmup of 5 steps, then the decay
    out = tmp_path / 'ranks/checkpoint_step_000010'
    args = ['export', str(source), '--format', 'infinitrain-lrs', '--ddp', '2', '--output', str(out)]
    assert ckpt.main(args) == 0, capsys.readouterr()
    ranks = sorted(out.glob('rank_*'))
    assert [r.name for r in ranks] == ['rank_000000', 'rank_000001']
    for rank in ranks:
        assert (rank / 'lr_scheduler.ckpt').read_bytes() == (source / 'lr_scheduler.ckpt').read_bytes()
        assert read_trainer_state(rank / 'trainer_state.json').generation == 'lrs'
    capsys.readouterr()
    assert ckpt.main(['show', str(out), '--json']) == 0
    assert '"scheduler_1.last_step": "5 (int64)"' in capsys.readouterr().out


def test_a_scheduler_file_of_another_step_is_refused(lrs_gpt2):
    shutil.copy(
        SAMPLES / 'lrs-gpt2/a/checkpoint_step_000020/lr_scheduler.ckpt',
        lrs_gpt2 / 'a/checkpoint_step_000010/lr_scheduler.ckpt',
    )
    before = tree_digest(lrs_gpt2)
    result = _resume(_schedule('b.log'))
    _one_error_line(
        result, 'lr_scheduler.ckpt: last_step: expected global_step 10 (trainer_state.json), found 20'
    )
    assert tree_digest(lrs_gpt2) == before and not (lrs_gpt2 / 'b').exists()
