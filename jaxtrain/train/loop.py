"""The training run: set up, maybe resume, loop, save. `run(config)` returns an exit code.

Sections, in order: what train/setup.py builds (mesh and batch geometry, model, optimizer
and state, the jitted steps) / data / resume (checkpoint/resume.py) / the save policy
(saving.py) / the loop.

The state lives sharded on the mesh (parallel/) and the train step is jitted once with
those shardings in and out, so a step never moves parameters between layouts. With
several processes every process runs this same function on the same config.
"""

import time

import numpy as np

from jaxtrain.checkpoint.resume import resume_into
from jaxtrain.data.run_streams import open_run_streams
from jaxtrain.parallel import sharding
from jaxtrain.parallel.distributed import agree_on_step_end
from jaxtrain.train.banner import run_banner
from jaxtrain.train.progress import Progress
from jaxtrain.train.run_log import RunLog
from jaxtrain.train.saving import RunSaver
from jaxtrain.train.setup import build_trainer
from jaxtrain.train.stop_signal import StopRequest


class TrainingError(Exception):
    """The run cannot go on (e.g. a non-finite loss); the message is one line."""


def check_finite(step: int, loss: float, params_finite: bool, last_good) -> None:
    """Stops the run at a non-finite loss or parameters, saving nothing, so that no good
    checkpoint is rotated away; names the last good one."""
    if np.isfinite(loss) and params_finite:
        return
    last = (
        f'the last good checkpoint is {last_good}; resume from it with a lower --learning_rate or a --grad_clip'
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
    log = RunLog(config.metrics_dir)
    parts = build_trainer(config)  # mesh, geometry, model, optimizer, state, jitted steps
    geometry, schedule = parts.geometry, parts.schedule
    stream, val_stream = open_run_streams(config, geometry, parts.setup.model_config.vocab_size)

    resumed = resume_into(config, parts)
    state, parts.state = resumed.state, None  # no second reference may keep the fresh state alive
    for message in resumed.messages:
        log.info(message)
    step, data_position = int(state.step), int(state.data_position)
    saver = RunSaver(config, parts, stream, resumed.step_dir, step, report=log.info)
    if saver.deleted_later_steps:
        log.info(
            f'overwrite_later_checkpoints: deleted steps {saver.deleted_later_steps} of {saver.checkpointer.root}'
        )

    weights = parts.setup.source if resumed.step_dir is None else f'checkpoint {resumed.step_dir}'
    for line in run_banner(config, parts, stream, weights):
        log.info(line)
    if step >= config.num_iteration:
        log.info(f'nothing to do: the run is at step {step} and num_iteration is {config.num_iteration}')

    stop = StopRequest().install()
    stopping = False  # `stop` as all processes agree on it (agree_on_step_end)
    epoch = stream.epoch_of(data_position)
    batch_shape = (geometry.accumulation, geometry.rows_per_micro_step, geometry.sequence_length)
    progress = Progress(step, config.num_iteration, geometry.tokens_per_step, log.info)  # + compiling line
    try:
        while step < config.num_iteration:
            # Every process reads the whole window (a pure function of the position) and
            # supplies its own devices' rows of it.
            inputs, targets = stream.window(data_position)
            inputs, targets = sharding.put_global(
                (inputs.reshape(batch_shape), targets.reshape(batch_shape)), parts.train_batch_sharding
            )
            began = time.perf_counter()
            state, metrics = parts.train_step(state, inputs, targets)
            loss = float(metrics['loss'])
            elapsed = time.perf_counter() - began
            step, data_position = step + 1, data_position + 1
            check_finite(step, loss, bool(metrics['params_finite']), saver.last_good())
            log.step(
                step,
                config.num_iteration,
                loss,
                float(schedule(step - 1)),
                elapsed,
                geometry.tokens_per_step,
                geometry.data_parallel,
                {'grad_norm': float(metrics['grad_norm'])},
            )
            progress.step(step, loss, elapsed)
            if stream.epoch_of(data_position) != epoch:
                epoch = stream.epoch_of(data_position)
                log.info(f'data: epoch {epoch} begins (the stream wrapped to its start after step {step})')
            if val_stream is not None and step % config.val_loss_every == 0:
                val_loss = validate(parts, state, val_stream, config.val_max_steps)
                log.info(f'step {step:4d}/{config.num_iteration} | val loss {val_loss:.6f}')
                log.record({'step': step, 'val_loss': val_loss})
            stopping, due_by_clock = agree_on_step_end(bool(stop), saver.clock_due())
            if saver.due(step, due_by_clock, stopping):
                log.record({'step': step, 'save_blocked_s': saver.save(state, step, data_position, loss)})
            if stopping:
                break
    finally:
        stop.restore()
        saver.close()
        log.close()
    progress.summary(saver.events.committed if saver.events else [])
    return _exit(log, stop, stopping, saver, step)


def _exit(log, stop, stopping: bool, saver: RunSaver, step: int) -> int:
    """The closing line and the exit code: 0, or 128 + the signal for a stop with nothing saved."""
    if stopping:
        signal_name = stop.signal_name or 'a signal to another process'
        if saver.last_saved_step == step:
            log.info(
                f'{signal_name}: stopped after step {step}; resume with --resume_from '
                f'{saver.checkpointer.step_dir(step)}'
            )
            return 0
        log.info(f'{signal_name}: stopped after step {step}; nothing saved (no checkpoint_dir)')
        return 128 + {'SIGINT': 2, 'SIGTERM': 15}.get(stop.signal_name, 0)
    if saver.last_saved_step is not None:
        log.info(f'saved: {saver.checkpointer.step_dir(saver.last_saved_step)}')
    return 0
