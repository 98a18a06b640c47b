"""The learning-rate scheduler in InfiniTrain step directories (PR 151): which generation a save writes,
the lr_scheduler.ckpt it adds, and what a resume takes from one.

Generations of `--checkpoint_format infinitrain` (model.ckpt, optimizer.ckpt, trainer_state.json):
  HEAD (b24d92f)            trainer_state.json with last_lr; no scheduler file
  LR scheduler (a7949ac0)   trainer_state.json without last_lr, plus lr_scheduler.ckpt unless the style
                            is none (infini_train/src/checkpoint/checkpoint.cc Checkpoint::Save)
A run writes the second when it spells its schedule with InfiniTrain's flags (--lr_decay_style and the
rest exist only from that generation on) or asks for it by name, `--checkpoint_format infinitrain-lrs`.

On resume upstream's Checkpoint::Load hands the file to LRScheduler::LoadState, which takes last_step,
recover_lr and base_lr as they are. Here the file must also agree with the run's flags, since an lr that
silently jumps is worse than a refusal: the entries, step counts and base_lr exactly, and recover_lr
within a relative 1e-5 (another C library's cosf may round differently); from there the run continues
from the file's values, as upstream does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ml_collections import ConfigDict

from jaxtrain.checkpoint.ckpt_text import ckpt_loading_lr_scheduler_line
from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain.steps import LRS_FORMAT
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.optim.infinitrain_lr_schedule import Replay, ScheduleSpec, state_at
from jaxtrain.optim.optimizer import ReplayedSchedule, schedule_spec
from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.lr_scheduler import FILE_NAME, describe, read_lr_scheduler, render_lr_scheduler
from llmc_io.infinitrain.state import LR_SCHEDULER

_RECOVER_LR_RTOL = 1e-5


def flags_text(spec: ScheduleSpec) -> str:
    if spec.style in ('none', 'constant') and not spec.warmup_iters:
        return f'--lr_decay_style {spec.style}'
    text = f'--lr_decay_style {spec.style} --min_lr {spec.min_lr:g} --lr_decay_iters {spec.decay_iters}'
    if spec.warmup_iters:
        text += f' --lr_warmup_iters {spec.warmup_iters} --lr_warmup_init {spec.warmup_init:g}'
    return text


def run_spec(config) -> ScheduleSpec:
    """The run's schedule in InfiniTrain's terms, or a one-line refusal where it has none."""
    spec = schedule_spec(config)
    if spec is None:
        raise CheckpointError(
            f"checkpoint_format: {LRS_FORMAT}: expected a schedule InfiniTrain can run, found llm.c's warmup "
            f'(warmup_steps {config.warmup_steps}); spell it with --lr_warmup_iters / --lr_warmup_init '
            '/ --lr_decay_style, or save as infinitrain (HEAD)'
        )
    return spec


class SchedulerFiles:
    """The lr_scheduler.ckpt of each save of one run (None for style none: upstream writes no file). Its
    replay is kept between saves, so a save costs the steps since the last one; a run resumed from a
    scheduler file continues from that file's state, as the schedule does. Refuses (one line, before
    training) a schedule upstream cannot run."""

    def __init__(self, config, schedule):
        self.spec, self.schedule = run_spec(config), schedule
        self._replay, self._saved = None, None

    def bytes_at(self, step: int) -> bytes | None:
        schedule = self.schedule
        saved = schedule.saved if isinstance(schedule, ReplayedSchedule) and schedule.saved else (0, None)
        if self._replay is None or saved is not self._saved:
            self._replay, self._saved = Replay(self.spec, saved_state=saved[1], saved_step=saved[0]), saved
        state = self._replay.state_at(step)
        return None if state is None else render_lr_scheduler(state)


def saved_scheduler(step_dir) -> tuple[Path, dict] | None:
    """(path, entries) of a step directory's lr_scheduler.ckpt (rank 0's), or None when it has none."""
    path = it.rank_dirs(step_dir)[0] / FILE_NAME
    if not path.is_file():
        return None
    try:
        return path, read_lr_scheduler(path)
    except LLMCFormatError as e:
        raise CheckpointError(str(e)) from None


def _mismatch(path, key, expected, found, spec, step) -> CheckpointError:
    return CheckpointError(
        f'{path}: {key}: expected {expected} (what {flags_text(spec)} gives after step {step}), found '
        f'{found}; resume with the schedule flags the checkpoint was trained with'
    )


def check_against_run(path, saved: dict, spec: ScheduleSpec, step: int) -> None:
    """Refuses (one line) a saved scheduler state that the run's flags would not have written at `step`."""
    if spec.style == 'none':
        raise CheckpointError(
            f'{path}: expected no {FILE_NAME} with --lr_decay_style none (upstream writes none), found one '
            f'of {len(saved)} entries; resume with the schedule flags the checkpoint was trained with'
        )
    if saved.get('last_step') != step:
        raise CheckpointError(
            f'{path}: last_step: expected global_step {step} (trainer_state.json), found '
            f"{saved.get('last_step')}; the directory mixes the files of two steps: use a step "
            'directory as it was saved'
        )
    expected = state_at(spec, step)
    if set(saved) != set(expected):
        shape = {3: 'a plain scheduler (no warmup)', 9: 'a warmup then the decay (SequentialLR)'}
        raise _mismatch(
            path,
            'entries',
            shape.get(len(expected), f'{len(expected)} entries'),
            shape.get(len(saved), f'{len(saved)} entries: {", ".join(saved)}'),
            spec,
            step,
        )
    # Step counts first (they say which warmup), then base_lr, then the lr itself.
    for key in sorted(expected, key=lambda k: (not k.endswith('last_step'), k.endswith('recover_lr'))):
        want, got = expected[key], saved[key]
        if type(got) is not type(want):
            raise _mismatch(path, key, f'a {type(want).__name__}', type(got).__name__, spec, step)
        if key.endswith('recover_lr'):
            same = np.isclose(float(got), float(want), rtol=_RECOVER_LR_RTOL, atol=0.0)
        else:
            same = got == want
        if not same:
            # A float entry as its shortest float32 spelling (0.07525, not 0.07524999976158142).
            shown = (np.float32(want), np.float32(got)) if key.endswith('_lr') else (want, got)
            raise _mismatch(path, key, *map(str, shown), spec, step)


def resume_schedule(config, schedule, step_dir, step: int, generation: str) -> list[str]:
    """Continues the run's schedule from the step directory's lr_scheduler.ckpt (checked against the
    flags first). Lines for the log; a CheckpointError for a file that does not fit."""
    found = saved_scheduler(step_dir)
    spec = schedule_spec(config)
    if found is None:
        if generation == LR_SCHEDULER and spec is not None and spec.style != 'none':
            # Upstream restarts its scheduler at step 0 here (a WARNING); the step count says where it was.
            notice = (
                f'resume: {step_dir} has no {FILE_NAME}; the schedule continues at step {step} from the '
                'flags (InfiniTrain would restart it at step 0)'
            )
            return [notice]
        return []
    path, saved = found
    if spec is None:
        raise CheckpointError(
            f'{path}: expected no {FILE_NAME} with llm.c\'s warmup (warmup_steps {config.warmup_steps}), '
            'found one; resume with the InfiniTrain schedule flags the checkpoint was trained with'
        )
    check_against_run(path, saved, spec, step)
    if isinstance(schedule, ReplayedSchedule):
        schedule.continue_from(step, saved)
    # Upstream prints the --load path as given, then the file name.
    given = Path(config.resume_from) if config.resume_from not in ('', 'latest') else Path(step_dir)
    shown = given / path.relative_to(Path(step_dir).absolute()) if path.is_absolute() else path
    return [ckpt_loading_lr_scheduler_line(shown)]


# --- ckpt show / verify ------------------------------------------------------------------------------------


def show_fields(step_dir) -> dict:
    """`ckpt show`'s view of the scheduler file: its entries in file order, or that there is none."""
    found = saved_scheduler(step_dir)
    if found is None:
        return {'lr_scheduler': f'no {FILE_NAME} (style none, or a generation before PR 151)'}
    _, saved = found
    return {
        'lr_scheduler': {name: describe(value) for name, value in saved.items()},
        'next_lr': float(saved['recover_lr']) if 'recover_lr' in saved else None,
    }


def verify_scheduler(step_dir, global_step: int) -> tuple[list[str], list[str]]:
    """(problems, checked) of the scheduler file: it parses strictly, and its step is the directory's."""
    try:
        found = saved_scheduler(step_dir)
    except CheckpointError as e:
        return [str(e)], []
    if found is None:
        return [], []
    path, saved = found
    problems = []
    for key in ('last_step', 'recover_lr', 'base_lr'):
        if key not in saved:
            problems.append(f'{path}: {key}: expected an entry (LRScheduler::LoadState reads it), found none')
    if saved.get('last_step', global_step) != global_step:
        problems.append(
            f'{path}: last_step: expected global_step {global_step} (trainer_state.json), found '
            f"{saved['last_step']}"
        )
    lrs = [float(v) for k, v in saved.items() if k.endswith('_lr') and isinstance(v, np.float32)]
    if not all(np.isfinite(lr) and lr >= 0 for lr in lrs):
        problems.append(f'{path}: learning rates: expected finite values >= 0, found {lrs}')
    return problems, [f'{FILE_NAME}: {len(saved)} entries, last_step {saved.get("last_step")}']


# --- ckpt export --format infinitrain-lrs -------------------------------------------------------------------


def exported_scheduler(step_dir, record: dict, step: int) -> bytes | None:
    """lr_scheduler.ckpt for an export of `step_dir` into the LR-scheduler generation: an InfiniTrain
    source's own file, else the state the recorded training config's schedule has at `step` (None for
    style none). A schedule upstream cannot run is refused on one line."""
    if it.detect_kind(step_dir):
        found = saved_scheduler(step_dir)
        if found is not None:
            return render_lr_scheduler(found[1])
    training = record.get('training_config')
    if not training:
        raise CheckpointError(
            f'{step_dir}: training_config: expected the recorded schedule flags (jaxtrain writes them), '
            f'found none; export --format {it.HEAD_KIND} instead, or resume it with the flags and save'
        )
    config = ConfigDict(training)
    spec = schedule_spec(config)
    if spec is None:
        raise CheckpointError(
            f"{step_dir}: schedule: expected one InfiniTrain can run, found llm.c's warmup (warmup_steps "
            f'{config.warmup_steps}); export --format {it.HEAD_KIND} instead'
        )
    state = state_at(spec, step)
    return None if state is None else render_lr_scheduler(state)
