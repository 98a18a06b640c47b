"""The training run: set up, maybe resume, loop, save. `run(config)` returns an exit code.

Sections, in order: what trainer_setup.py builds (mesh and batch geometry, model,
optimizer and state, the jitted steps) / data / resume / checkpoints / the loop.

The state lives sharded on the mesh (mesh.py, sharding.py) and the train step is jitted
once with those shardings in and out, so a step never moves parameters between layouts.
With several processes every process runs this same function on the same config.
"""

import dataclasses
import hashlib
import platform
import time

import jax
import numpy as np

from jaxtrain.checkpoint import manager as ckpt
from jaxtrain.parallel import mesh as mesh_lib
from jaxtrain.parallel import sharding
from jaxtrain.data.stream import TokenStream
from jaxtrain.parallel.distributed import agree_on_step_end
from jaxtrain.train import run_log
from jaxtrain.train.run_log import RunLog
from jaxtrain.train.stop_signal import StopRequest
from jaxtrain.train.setup import build_trainer


class TrainingError(Exception):
    """The run cannot go on (e.g. a non-finite loss); the message is one line."""


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 24), b''):
            digest.update(chunk)
    return digest.hexdigest()


def library_versions() -> dict:
    import flax
    import optax
    import orbax.checkpoint

    return {
        'python': platform.python_version(),
        'jax': jax.__version__,
        'flax': flax.__version__,
        'optax': optax.__version__,
        'orbax-checkpoint': orbax.checkpoint.__version__,
    }


def _data_paths(config) -> tuple[str, str]:
    if config.input_bin:
        return config.input_bin, config.input_val_bin
    if config.model_family != 'gpt2':
        raise ValueError(
            'input_bin: expected a glob of LLaMA-3 token shards, found none; the built-in '
            'corpus is GPT-2 only. Pass --input_bin PATTERN.'
        )
    from jaxtrain.data.default_corpus import ensure_default_corpus

    train_path, val_path = ensure_default_corpus()
    return train_path, config.input_val_bin or val_path


def run(config) -> int:
    log = RunLog(config.metrics_dir)
    parts = build_trainer(config)  # mesh, geometry, model, optimizer, state, jitted steps
    mesh, devices, replicated = parts.mesh, parts.devices, parts.replicated
    geometry, topology, setup = parts.geometry, parts.topology, parts.setup
    tx, schedule, state = parts.tx, parts.schedule, parts.state
    parts.state = None  # a resume replaces it: no second reference may keep it in memory
    model_config = setup.model_config
    llmc_sha256 = file_sha256(setup.llmc_file) if setup.llmc_file else ''

    # --- data ---
    train_pattern, val_pattern = _data_paths(config)
    stream = TokenStream(
        train_pattern,
        geometry.tokens_per_step,
        config.sequence_length,
        model_config.vocab_size,
        name='train',
        model_family=config.model_family,
    )
    val_stream = None
    if config.val_loss_every > 0 and val_pattern:
        val_stream = TokenStream(
            val_pattern,
            geometry.rows_per_micro_step * config.sequence_length,
            config.sequence_length,
            model_config.vocab_size,
            name='val',
            model_family=config.model_family,
        )
        if config.val_max_steps > val_stream.windows_per_epoch:
            raise ValueError(
                f'val_max_steps: expected at most the {val_stream.windows_per_epoch} batches '
                f'{val_pattern} holds at this batch geometry, found {config.val_max_steps}'
            )

    # --- resume ---
    resume_dir, notice = ckpt.resolve_resume(config.resume_from, config.checkpoint_dir)
    if notice:
        log.info(notice)
    training_config = config.to_dict()
    model_config_dict = dataclasses.asdict(model_config)
    if resume_dir is not None:
        saved = ckpt.read_trainer_state(resume_dir)
        incompatible, changes = ckpt.compare_with_run(saved, model_config_dict, training_config)
        if incompatible:
            raise ckpt.CheckpointError(
                f'{resume_dir}: does not fit this run: '
                + '; '.join(incompatible)
                + '. Resume it with the settings it was saved with (python -m jaxtrain.ckpt show '
                f'{resume_dir} lists them), or start a new run without --resume_from.'
            )
        for change in changes:
            log.info(f'resume: changed since the checkpoint: {change}')
        # Restored straight onto this run's shardings, whatever mesh saved them.
        params, opt_state, saved = ckpt.restore(resume_dir, state.params, state.opt_state)
        if opt_state is None:
            log.info(f'resume: {resume_dir} has no optimizer state; starting with fresh optimizer moments')
            fresh = lambda p: ckpt.set_schedule_position(tx.init(p), saved['step'])
            opt_state = jax.jit(fresh, out_shardings=parts.opt_shardings)(params)
        state = state.replace(
            step=sharding.put_global(np.int32(saved['step']), replicated),
            data_position=sharding.put_global(np.int32(saved['data_position']), replicated),
            params=params,
            opt_state=opt_state,
            rng=sharding.put_global(np.asarray(saved['rng'], dtype=np.uint32), replicated),
        )
        log.info(run_log.ckpt_load_done_line(saved))
        log.info(
            f"resume: restored step {saved['step']} from {resume_dir} "
            f"({ckpt.topology_change(saved.get('topology', {}), topology)})"
        )
    start_step = int(state.step)
    data_position = int(state.data_position)

    # --- checkpoints ---
    saving = bool(config.checkpoint_dir) and (config.save_steps > 0 or config.save_every_minutes > 0)
    checkpointer = None
    if config.checkpoint_dir:
        protected = (
            [ckpt.step_of(resume_dir)]
            if resume_dir is not None
            and resume_dir.parent.absolute() == ckpt.Path(config.checkpoint_dir).absolute()
            else []
        )
        checkpointer = ckpt.Checkpointer(
            config.checkpoint_dir,
            keep_latest=config.max_checkpoint_keep,
            keep_every=config.keep_every_steps,
            protected_steps=protected,
        )
        deleted = checkpointer.refuse_later_steps(start_step, config.overwrite_later_checkpoints)
        if deleted:
            log.info(f'overwrite_later_checkpoints: deleted steps {deleted} of {checkpointer.root}')

    versions = library_versions()

    def save(state, step: int, position: int) -> float:
        """Starts an asynchronous save of `state`, which is at (host-side) `step` and data
        `position`; returns the seconds the loop was blocked."""
        began = time.perf_counter()
        opt_state = state.opt_state if config.save_optimizer_state else None
        record = ckpt.trainer_state_record(
            config,
            step=step,
            data_position=position,
            epoch=stream.epoch_of(position),
            learning_rate=float(schedule(step)),
            model_config=model_config_dict,
            tokens_per_step=geometry.tokens_per_step,
            topology=topology,
            versions=versions,
            llmc_file=setup.llmc_file,
            llmc_sha256=llmc_sha256,
        )
        as_given = ckpt.Path(config.checkpoint_dir) / ckpt.step_dir_name(step)  # as InfiniTrain prints it
        log.info(run_log.ckpt_save_begin_line(as_given, step))
        checkpointer.save(step, state.params, opt_state, state.rng, record)
        log.info(run_log.ckpt_save_done_line(as_given))  # handed off; see run_log
        return time.perf_counter() - began

    # --- the loop ---
    train_step, eval_step = parts.train_step, parts.eval_step
    log.info(
        f'model: {config.model_family} {model_config} | {model_config.num_parameters:,} parameters | '
        f'weights: {setup.source}'
    )
    log.info(
        f'devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}) in '
        f'{jax.process_count()} process(es) | mesh {mesh_lib.describe(mesh)} | '
        f'{sharding.describe_sharded(parts.param_shardings)} | dtype {config.dtype}'
    )
    log.info(
        f'batch: {geometry.batch_size} x {geometry.sequence_length} x DP {geometry.data_parallel} '
        f'(data x fsdp) x accumulation {geometry.accumulation} = {geometry.tokens_per_step} tokens/step'
    )
    log.info(f'data: {stream.describe()}')
    if start_step >= config.num_iteration:
        log.info(
            f'nothing to do: the run is at step {start_step} and num_iteration is {config.num_iteration}'
        )

    stop = StopRequest().install()
    stopping = False  # `stop` as all processes agree on it (agree_on_step_end)
    last_saved_step, last_save_time = None, time.monotonic()
    epoch = stream.epoch_of(data_position)
    step = start_step
    try:
        while step < config.num_iteration:
            # Every process reads the whole window (a pure function of the position) and
            # supplies its own devices' rows of it.
            inputs, targets = stream.window(0 if config.overfit_single_batch else data_position)
            shape = (geometry.accumulation, geometry.rows_per_micro_step, geometry.sequence_length)
            inputs, targets = sharding.put_global(
                (inputs.reshape(shape), targets.reshape(shape)), parts.train_batch_sharding
            )
            began = time.perf_counter()
            state, metrics = train_step(state, inputs, targets)
            loss = float(metrics['loss'])
            elapsed = time.perf_counter() - began
            step, data_position = step + 1, data_position + 1
            if not np.isfinite(loss) or not bool(metrics['params_finite']):
                # The last good state on disk: this run's last save, else the one it resumed.
                good = checkpointer.step_dir(last_saved_step) if last_saved_step is not None else resume_dir
                last = (
                    f'the last good checkpoint is {good}; resume from it with a lower --learning_rate '
                    'or a --grad_clip'
                    if good is not None
                    else 'there is no checkpoint of this run'
                )
                raise TrainingError(
                    f'step {step}: loss is {loss} (parameters finite: '
                    f"{bool(metrics['params_finite'])}); stopped without saving; {last}"
                )
            log.step(
                step,
                config.num_iteration,
                loss,
                float(schedule(step - 1)),
                elapsed,
                geometry.tokens_per_step,
                parts.parallel_sizes,
                {'grad_norm': float(metrics['grad_norm'])},
            )
            if stream.epoch_of(data_position) != epoch:
                epoch = stream.epoch_of(data_position)
                log.info(f'data: epoch {epoch} begins (the stream wrapped to its start after step {step})')
            if val_stream is not None and step % config.val_loss_every == 0:
                losses = [
                    float(eval_step(state.params, *sharding.put_global((x, y), parts.val_batch_sharding)))
                    for x, y in val_stream.val_windows(config.val_max_steps)
                ]
                log.info(f'step {step:4d}/{config.num_iteration} | val loss {np.mean(losses):.6f}')
                log.record({'step': step, 'val_loss': float(np.mean(losses))})
            stopping, due_by_clock = agree_on_step_end(
                bool(stop),
                config.save_every_minutes > 0
                and time.monotonic() - last_save_time >= 60 * config.save_every_minutes,
            )
            due = saving and (
                (config.save_steps > 0 and step % config.save_steps == 0)
                or step == config.num_iteration
                or due_by_clock
            )
            if checkpointer is not None and (due or stopping):
                blocked = save(state, step, data_position)
                last_saved_step, last_save_time = step, time.monotonic()
                log.record({'step': step, 'save_blocked_s': blocked})
            if stopping:
                break
    finally:
        stop.restore()
        if checkpointer is not None:
            checkpointer.close()  # waits for the last write to be committed
        log.close()

    if stopping:
        signal_name = stop.signal_name or 'a signal to another process'
        if last_saved_step == step and checkpointer is not None:
            log.info(
                f'{signal_name}: stopped after step {step}; resume with --resume_from '
                f'{checkpointer.step_dir(step)}'
            )
            return 0
        log.info(f'{signal_name}: stopped after step {step}; nothing saved (no checkpoint_dir)')
        return 128 + {'SIGINT': 2, 'SIGTERM': 15}.get(stop.signal_name, 0)
    if last_saved_step is not None:
        log.info(f'saved: {checkpointer.step_dir(last_saved_step)}')
    return 0
