"""The training run: set up, maybe resume, loop, save. `run(config)` returns an exit code.

Sections, in order: what train/setup.py builds (mesh and batch geometry, model, optimizer
and state, the jitted steps) / data / resume (checkpoint/resume.py) / the save policy
(saving.py) / the loop.

The state lives sharded on the mesh (parallel/) and the train step is jitted once with
those shardings in and out, so a step never moves parameters between layouts. With
several processes every process runs this same function on the same config.

StopRequest: SIGTERM / SIGINT ask the loop to stop after the current step (and save). The
handler stays installed until the last save is committed (run restores it only after the
saver's close), so a preemption during the final save waits for that save.

A second signal (either kind) aborts at once: one line saying what is lost, the lock of
the checkpoint root released, and os._exit, which skips the interpreter's teardown. A
plain exit would unwind while Orbax's and TensorStore's threads still write, and a C++
thread destroyed while it runs ends the process in `terminate called without an active
exception` (exit 134) instead of the exit code of the signal.
"""

import os
import signal
import sys
import time

import jax
import numpy as np

from jaxtrain.checkpoint import ckpt_text
from jaxtrain.checkpoint.layout import step_dir_names
from jaxtrain.checkpoint.resume import resume_into
from jaxtrain.checkpoint.root_access import owned_checkpoint_dir, release_held
from jaxtrain.data.stream import open_run_streams
from jaxtrain.models.lora import save_lora_weights
from jaxtrain.parallel import sharding
from jaxtrain.parallel.platform import agree_on_step_end
from jaxtrain.optim.optimizer import learning_rate_at, spelled_with_infinitrain_flags
from jaxtrain.train.dashboards import Dashboards
from jaxtrain.train.progress import MFUMeter, Progress, run_banner, run_record
from jaxtrain.train.run_log import RecordWriteError, RunLog
from jaxtrain.train.samples import make_sampler
from jaxtrain.train.saving import RunSaver
from jaxtrain.train.setup import build_trainer
from jaxtrain.train.step_trace import StepTrace


class TrainingError(Exception):
    """The run cannot go on (e.g. a non-finite loss); the message is one line."""


def check_finite(step: int, loss: float, params_finite: bool, last_good) -> None:
    """Stops the run at a non-finite loss or parameters, saving nothing, so that no good
    checkpoint is rotated away; names the last good one."""
    if np.isfinite(loss) and params_finite:
        return
    last = (
        f'the last good checkpoint is {last_good}; resume from it with a lower --learning_rate or a '
        '--grad_clip'
        if last_good is not None
        else 'there is no checkpoint of this run'
    )
    raise TrainingError(
        f'step {step}: loss is {loss} (parameters finite: {params_finite}); stopped without saving; {last}'
    )


def validate(parts, state, val_stream, max_steps: int) -> float:
    losses = [
        float(parts.eval_step(state.params, *sharding.put_global((x, y), parts.val_batch_sharding)))
        for x, y in val_stream.val_windows(max_steps)
    ]
    return float(np.mean(losses))


def run(config) -> int:
    """Trains a config that checks/config_checks.py's check_config has accepted (the entry points
    check it before they start anything)."""
    # Before anything is built: a refused run changes nothing (root_access.py).
    with owned_checkpoint_dir(config):
        return _run(config)


def _run(config) -> int:
    log = RunLog(config.metrics_dir)
    try:
        return _train(config, log)
    except RecordWriteError as error:
        # A writer of the run's record failed (run_log.py): the run ends in one line, after the
        # loop has waited for the saves under way, so the notice names what is committed.
        log.failed = True
        saved = log.checkpoint_notice() if log.checkpoint_notice else 'nothing of this run is saved yet'
        raise TrainingError(f'{error}; the run stopped without saving; {saved}') from None
    except BaseException:
        log.failed = True
        raise
    finally:
        log.close()  # a second close does nothing: the loop closes it before its summary


def _train(config, log: RunLog) -> int:
    parts = build_trainer(config)  # mesh, geometry, model, optimizer, state, jitted steps
    geometry, schedule = parts.geometry, parts.schedule
    stream, val_stream = open_run_streams(config, geometry, parts.setup.model_config.vocab_size)
    sampler = make_sampler(config, parts)  # None unless samples are asked for (train/samples.py)

    restore_began = time.perf_counter()
    resumed = resume_into(config, parts)
    restore_s = time.perf_counter() - restore_began
    state, parts.state = resumed.state, None  # no second reference may keep the fresh state alive
    for message in resumed.messages:
        log.info(message)
    if resumed.record is not None:  # InfiniTrain's line, for diffing logs; PR 151's binary prints no last_lr
        record = resumed.record
        if spelled_with_infinitrain_flags(config):
            record = dict(record, learning_rate=None)
        log.info(ckpt_text.ckpt_load_done_line(record))
    step, data_position = int(state.step), int(state.data_position)
    log.dashboards = Dashboards(config, step, log.is_main)  # a resumed run appends from its step
    if resumed.step_dir is not None:
        log.record({'step': step, 'restore_s': restore_s})
    mfu = MFUMeter(
        config.model_family,
        parts.setup.model_config,
        geometry.sequence_length,
        geometry.tokens_per_step,
        parts.devices,
        config.dtype,
        config.peak_tflops,
    )
    saver = RunSaver(config, parts, stream, resumed.step_dir, step, report=log.info, record=log.record)
    log.checkpoint_notice = saver.abort_notice
    if saver.checkpointer is not None and saver.checkpointer.set_aside:
        aside = saver.checkpointer.set_aside
        log.info(f'checkpoint_dir: not committed steps (no trainer state / model file), set aside: {aside}')
    if saver.checkpointer is not None and saver.checkpointer.linked:
        links = step_dir_names(saver.checkpointer.linked)
        log.info(f'checkpoint_dir: symbolic links, kept out of rotation (never deleted): {links}')
    if saver.deleted_later_steps:
        log.info(
            f'overwrite_later_checkpoints: deleted steps {saver.deleted_later_steps} of '
            f'{saver.checkpointer.root}'
        )

    weights = parts.setup.source if resumed.step_dir is None else f'checkpoint {resumed.step_dir}'
    for line in run_banner(config, parts, stream, weights):
        log.info(line)
    log.write_config(run_record(config, parts, weights))
    if step >= config.num_iteration:
        log.info(f'nothing to do: the run is at step {step} and num_iteration is {config.num_iteration}')

    stop = StopRequest(saver.abort_notice).install()
    stopping = False  # `stop` as all processes agree on it (agree_on_step_end)
    epoch = stream.epoch_of(data_position)
    batch_shape = (geometry.accumulation, geometry.rows_per_micro_step, geometry.sequence_length)

    def device_batch(position):
        # Every process reads the whole window (a pure function of the position) and
        # supplies its own devices' rows of it.
        inputs, targets = stream.window(0 if config.overfit_single_batch else position)
        return sharding.put_global(
            (inputs.reshape(batch_shape), targets.reshape(batch_shape)), parts.train_batch_sharding
        )

    # The device is kept busy: step n+1 is dispatched, and step n+2's batch built, before
    # the host waits for step n's metrics, so step n is checked for a non-finite loss one
    # step late, but always before a save (a save waits for its own step's metrics; its
    # device copy of the state is dispatched before that wait, so it overlaps the step). A
    # step's time is the wall clock from the previous step's read to its own: every host
    # action between two steps counts, as a user waits for it.
    pending = None  # (step, data position, metrics) dispatched and not yet read
    last_read = time.perf_counter()

    def report(pending):
        nonlocal last_read, epoch
        done, position, metrics = pending
        metrics = jax.device_get(metrics)  # waits for the step
        now = time.perf_counter()
        elapsed, last_read = now - last_read, now
        loss = float(metrics['loss'])
        stop.last_shown_step = done
        check_finite(done, loss, bool(metrics['params_finite']), saver.last_good())
        saver.note_loss(loss)
        step_mfu, grad_norm = mfu.of(elapsed), float(metrics['grad_norm'])
        progress.step(done, loss, elapsed, step_mfu, grad_norm)
        log.step(
            done,
            config.num_iteration,
            loss,
            learning_rate_at(schedule, done - 1),
            elapsed,
            geometry.tokens_per_step,
            parts.parallel_sizes,
            {'grad_norm': grad_norm} | ({'mfu': step_mfu} if step_mfu is not None else {}),
        )
        if stream.epoch_of(position) != epoch:
            epoch = stream.epoch_of(position)
            log.info(f'data: epoch {epoch} begins (the stream wrapped to its start after step {done})')

    progress = Progress(step, config.num_iteration, geometry.tokens_per_step, log.info)  # + compiling line
    saves_line = saver.prepare(state)
    if saves_line:
        log.info(saves_line)
    trace = StepTrace(
        config.trace_steps, config.trace_dir, log.info, jax.process_index(), jax.process_count()
    )
    try:
        batch = device_batch(data_position) if step < config.num_iteration else None
        while step < config.num_iteration:
            trace.before_step(step + 1, state)
            state, metrics = parts.train_step(state, *batch)
            step, data_position = step + 1, data_position + 1
            if step < config.num_iteration:
                batch = device_batch(data_position)  # while the device runs
            if pending is not None:
                report(pending)
            saver.between_steps()  # only the step just dispatched runs: a save's copies go beside it
            pending = (step, data_position, metrics)
            validating = val_stream is not None and step % config.val_loss_every == 0
            stopping, due_by_clock = agree_on_step_end(bool(stop), saver.clock_due())
            saving = saver.due(step, due_by_clock, stopping)
            sampling = sampler is not None and sampler.due(step)
            if saving:  # dispatched while the device still runs the step: the copy queues behind it
                snapshot, snapshot_s = saver.snapshot(state)
            if validating or saving or stopping or sampling or step == config.num_iteration:
                report(pending)  # this step's own loss, checked before it is saved
                pending = None
            if validating:
                val_loss = validate(parts, state, val_stream, config.val_max_steps)
                log.info(f'step {step:4d}/{config.num_iteration} | val loss {val_loss:.6f}')
                log.record({'step': step, 'val_loss': val_loss})
                saver.note_val_loss(step, val_loss)
            if sampling:  # timed and logged on its own, and kept out of the next step's time
                last_read += sampler.maybe_sample(log, step, state.params, state.rng)
            if saving:
                blocked_s = saver.save(snapshot, step, data_position)
                log.record({'step': step, 'save_blocked_s': blocked_s, 'save_snapshot_s': snapshot_s})
                del snapshot  # the background hand-off holds it until Orbax has copied it
            if stopping:
                break
        trace.finish(state, step)
        if config.lora_save_path:  # InfiniTrain's --lora_save_path: its file, after training
            log.info(save_lora_weights(config.lora_save_path, state.params, config.lora_save_layout))
    except BaseException:
        log.failed = True  # the dashboards mark the run failed, not finished
        trace.abandon()
        raise
    finally:
        try:
            saver.close()  # with the handler still installed: a signal now waits for the write
        finally:
            stop.restore()
            log.close()
    progress.summary(saver.events.committed if saver.events else [])
    return _exit(log, stop, stopping, saver, step)


def _exit(log, stop, stopping: bool, saver: RunSaver, step: int) -> int:
    """The closing line and the exit code: 0, or 128 + the signal for a stop with nothing saved."""
    if stopping:
        signal_name = stop.signal_name or 'a signal to another process'
        # The device runs a step ahead of the lines printed (loop above): steps already under way finish.
        if stop.arrived_after is not None and stop.arrived_after < step:
            running = 'step' if step - stop.arrived_after == 1 else 'steps'
            signal_name += (
                f' (arrived after step {stop.arrived_after} was printed; the {running} already running '
                'on the device finished first)'
            )
        if saver.last_saved_step == step:
            log.info(
                f'{signal_name}: stopped after step {step}; resume with --resume_from '
                f'{saver.checkpointer.step_dir(step)}'
            )
            return 0
        log.info(f'{signal_name}: stopped after step {step}; nothing saved (no checkpoint_dir)')
        return 128 + {'SIGINT': 2, 'SIGTERM': 15}.get(stop.signal_name, 0)
    if stop:
        log.info(f'{stop.signal_name}: arrived during the last save, which was waited for')
    if saver.last_saved_step is not None:
        log.info(f'saved: {saver.checkpointer.step_dir(saver.last_saved_step)}')
    return 0


class StopRequest:
    def __init__(self, describe_loss=lambda: ''):
        """describe_loss: what an abort loses, for its line (RunSaver.abort_notice)."""
        self.signal_name = ''
        self.last_shown_step = None  # set by the loop as it prints each step
        self.arrived_after = None  # last_shown_step when the first signal came
        self._previous = {}
        self._describe_loss = describe_loss

    def __bool__(self):
        return bool(self.signal_name)

    def _handle(self, signum, frame):
        if self.signal_name:
            self._abort(signum)
        self.arrived_after = self.last_shown_step
        self.signal_name = signal.Signals(signum).name

    def _abort(self, signum):
        try:
            lost = self._describe_loss() or 'the run stopped without its last save'
        except Exception as e:  # noqa: BLE001  the abort must happen whatever the report does
            lost = f'what was lost is unknown ({type(e).__name__})'
        try:
            release_held()
            sys.stdout.flush()  # may be mid-write in the interrupted frame: then it raises
        except Exception:  # noqa: BLE001, S110  nothing may stop the abort
            pass
        # os.write, not print: the interrupted code may hold sys.stderr's buffer.
        os.write(2, f'{signal.Signals(signum).name} again: aborted at once; {lost}\n'.encode())
        os._exit(128 + signum)

    def install(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
