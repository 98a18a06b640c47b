"""The benchmark's measurements, without its command line: the trainer's own step built
on one window of random ids (build), timed phases, saves and their costs, and one run of
the whole benchmark (run_benchmark). bench.py holds the flags and the report; the pipeline
bench and the tests import this module, which defines no absl flags."""

import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain.checkpoint import manager as ckpt_manager
from jaxtrain.checkpoint.formats.orbax import restore as orbax_format
from jaxtrain.checkpoint import trainer_state as ckpt_record
from jaxtrain.train import step_trace as kernel_profile
from jaxtrain.parallel import sharding
from jaxtrain.models.setup import DTYPES
from jaxtrain.models.attention import resolve_attention
from jaxtrain.optim.optimizer import learning_rate_at
from jaxtrain.train.progress import MFUMeter, training_flops_per_token
from jaxtrain.train.setup import TrainerSetup, TrainState, build_trainer


_MATMUL_SAMPLES = 5  # burst samples


def command_line() -> str:
    return ' '.join(['python -m jaxtrain.bench', *sys.argv[1:]])


class BenchError(Exception):
    """The benchmark cannot give a meaningful number; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Settings:
    warmup: int
    steps: int
    save_every: int
    save_dir: str
    matmul_size: int
    smoke: bool
    profile_steps: int = 0


def measure_matmul_flops(size: int) -> dict:
    """FLOP/s of a bf16 size^3 matmul on the first device, two ways: what the device delivers
    today, beside the model's FLOP/s (MFU's peak is the data sheet's, train/progress.py).

    burst: the median of short runs, each after a rest, as the H200's 790 TFLOP/s reference
    figure was measured; sustained: the median of the second half of a long back-to-back run. An H200
    keeps its burst rate for ~50 ms, then its power limit settles it near 670 TFLOP/s
    (measured here), and a training run lives in that second regime.
    """
    on_gpu = jax.default_backend() == 'gpu'
    size = size or (8192 if on_gpu else 1024)
    # A GPU matmul takes about a millisecond, so one dispatch's latency would be a few % of
    # it: a sample is several queued calls.
    calls, rest_s, sustained_samples = (10, 0.25, 40) if on_gpu else (1, 0.0, 10)
    a, b = (
        jax.random.normal(key, (size, size), jnp.bfloat16) for key in jax.random.split(jax.random.key(0), 2)
    )
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()  # compile

    def sample() -> float:
        began = time.perf_counter()
        for _ in range(calls):
            c = matmul(a, b)
        c.block_until_ready()
        return 2 * size**3 * calls / (time.perf_counter() - began)

    burst = []
    for _ in range(_MATMUL_SAMPLES):
        time.sleep(rest_s)
        burst.append(sample())
    sustained = [sample() for _ in range(sustained_samples)][sustained_samples // 2 :]
    return {
        'matmul_size': size,
        'matmul_burst_flops': statistics.median(burst),
        'matmul_sustained_flops': statistics.median(sustained),
    }


def _peak_bytes_in_use(devices) -> int | None:
    """The largest peak over the devices; None where the backend keeps no statistics (CPU)."""
    peaks = [(d.memory_stats() or {}).get('peak_bytes_in_use') for d in devices]
    return max(peaks) if all(p is not None for p in peaks) else None


def _directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob('*') if f.is_file())


@dataclasses.dataclass
class Subject:
    """The trainer's pieces (train/setup.py) and one synthetic batch."""

    config: object
    parts: TrainerSetup
    state: TrainState | None  # None once the first step has taken (donated) it
    inputs_AxBxT: jax.Array
    targets_AxBxT: jax.Array

    @property
    def devices(self):
        return self.parts.devices

    @property
    def geometry(self):
        return self.parts.geometry

    @property
    def setup(self):
        return self.parts.setup


def build(config) -> Subject:
    """What train.run builds (train/setup.build_trainer: mesh, model, optimizer, state,
    the jitted step); the data is one window of random ids, reused every step."""
    parts = build_trainer(config)
    state, parts.state = parts.state, None
    geometry, model_config = parts.geometry, parts.setup.model_config
    # Ids below the real vocabulary, shifted by one into targets as data/stream.py's window is.
    tokens = np.random.default_rng(config.seed).integers(
        0, model_config.vocab_size, geometry.tokens_per_step + 1, dtype=np.int32
    )
    shape = (geometry.accumulation, geometry.rows_per_micro_step, geometry.sequence_length)
    inputs, targets = sharding.put_global(
        (tokens[:-1].reshape(shape), tokens[1:].reshape(shape)), parts.train_batch_sharding
    )
    return Subject(config, parts, state, inputs, targets)


@dataclasses.dataclass
class SaveTiming:
    """How long one save blocked the loop: the whole Checkpointer.save call."""

    step: int
    blocked_s: float


def make_save(subject: Subject, checkpointer: ckpt_manager.Checkpointer, versions: dict):
    """train.run's save(state): its trainer-state JSON (epoch 0: there is no data stream)
    and the Checkpointer's asynchronous save, timed as the loop sees it."""
    config, model_config = subject.config, subject.setup.model_config
    model_config_dict = dataclasses.asdict(model_config)
    llmc_sha256 = ckpt_record.file_sha256(subject.setup.llmc_file) if subject.setup.llmc_file else ''

    def save(state, step: int) -> SaveTiming:
        """As the trainer, which knows the step on the host: the state has no data stream, so
        its data position is its step."""
        began = time.perf_counter()
        record = ckpt_record.trainer_state_record(
            config,
            step=step,
            data_position=step,
            epoch=0,
            learning_rate=learning_rate_at(subject.parts.schedule, step),
            model_config=model_config_dict,
            tokens_per_step=subject.geometry.tokens_per_step,
            topology=subject.parts.topology,
            versions=versions,
            llmc_file=subject.setup.llmc_file,
            llmc_sha256=llmc_sha256,
        )
        opt_state = state.opt_state if config.save_optimizer_state else None
        checkpointer.save(step, state.params, opt_state, state.rng, record)
        return SaveTiming(step, time.perf_counter() - began)

    return save


@dataclasses.dataclass
class Phase:
    """One timed run of consecutive steps."""

    step_seconds: list[float]
    losses: list[float]
    wall_seconds: float  # the whole phase, saves included
    saves: list[SaveTiming]


def timed_steps(step_fn, state, subject: Subject, count: int, save_every=0, save=None):
    """Runs `count` steps, each timed to block_until_ready; saves after every save_every-th."""
    step_seconds, step_metrics, saves = [], [], []
    first_step = int(state.step)  # the host's step counter, as the trainer keeps one
    phase_began = time.perf_counter()
    for i in range(count):
        began = time.perf_counter()
        state, metrics = step_fn(state, subject.inputs_AxBxT, subject.targets_AxBxT)
        jax.block_until_ready((state, metrics))
        step_seconds.append(time.perf_counter() - began)
        step_metrics.append(metrics)
        if save_every and (i + 1) % save_every == 0:
            saves.append(save(state, first_step + i + 1))
    wall = time.perf_counter() - phase_began
    # Read after the phase, so that the host copies are not timed.
    losses = [float(m['loss']) for m in step_metrics]
    params_finite = [bool(m['params_finite']) for m in step_metrics]
    if not (np.all(np.isfinite(losses)) and all(params_finite)):
        raise BenchError(
            f'expected finite losses and parameters in every timed step, found losses {losses}, '
            f'parameters finite {params_finite}; try --config.dtype=float32 or a lower learning_rate'
        )
    return state, Phase(step_seconds, losses, wall, saves)


def measure_checkpoints(subject, step_fn, state, settings: Settings, baseline: Phase, versions: dict):
    """A warm-up save, a timed phase that saves every save_every steps, a restore. Returns
    (state, numbers)."""
    config, geometry = subject.config, subject.geometry
    median_step = statistics.median(baseline.step_seconds)
    with tempfile.TemporaryDirectory(prefix='jaxtrain-bench-', dir=settings.save_dir or None) as root:
        # Rotation as configured, but at most 2 kept so a long benchmark cannot fill the disk.
        checkpointer = ckpt_manager.Checkpointer(
            root, keep_latest=config.max_checkpoint_keep or 2, keep_every=0
        )
        save = make_save(subject, checkpointer, versions)
        # The first save compiles the checksum kernels and allocates host buffers: a one-off,
        # timed apart. Waiting for its write gives the background write time of one checkpoint.
        warmup = save(state, int(state.step))
        began = time.perf_counter()
        checkpointer.wait()
        write_seconds = time.perf_counter() - began

        state, saving = timed_steps(step_fn, state, subject, settings.steps, settings.save_every, save)
        began = time.perf_counter()
        checkpointer.wait()
        drain_seconds = time.perf_counter() - began
        newest = checkpointer.step_dir(saving.saves[-1].step)
        checkpoint_bytes = _directory_bytes(newest)
        began = time.perf_counter()
        restored = orbax_format.restore(newest, state.params, state.opt_state)
        jax.block_until_ready(restored[:2])
        restore_seconds = time.perf_counter() - began
        del restored
        checkpointer.close()

    tokens = settings.steps * geometry.tokens_per_step

    def ms(attribute: str) -> list[float]:
        return [1e3 * getattr(timing, attribute) for timing in saving.saves]

    return state, {
        'save_every': settings.save_every,
        'save_dir': str(Path(settings.save_dir or tempfile.gettempdir()).absolute()),
        'checkpoint_bytes': checkpoint_bytes,
        'warmup_save_blocked_ms': 1e3 * warmup.blocked_s,
        'write_s': write_seconds,
        'saved_steps': [s.step for s in saving.saves],
        'save_blocked_ms': ms('blocked_s'),
        'save_blocked_pct_of_step': [100 * s.blocked_s / median_step for s in saving.saves],
        'blocking_saves': checkpointer.blocking_saves,
        'saving_median_step_ms': 1e3 * statistics.median(saving.step_seconds),
        'phase_tokens_per_s_without_saves': tokens / baseline.wall_seconds,
        'phase_tokens_per_s_with_saves': tokens / saving.wall_seconds,
        'saving_throughput_ratio': baseline.wall_seconds / saving.wall_seconds,
        'drain_s': drain_seconds,
        'restore_s': restore_seconds,
        'saving_first_loss': saving.losses[0],
        'saving_last_loss': saving.losses[-1],
    }


def run_benchmark(config, settings: Settings, deterministic: bool) -> dict:
    subject = build(config)
    geometry, model_config, devices = subject.geometry, subject.setup.model_config, subject.devices

    began = time.perf_counter()
    lowered = subject.parts.train_step.lower(subject.state, subject.inputs_AxBxT, subject.targets_AxBxT)
    lowered_at = time.perf_counter()
    step_fn = lowered.compile()
    compiled_at = time.perf_counter()
    state = subject.state
    subject.state = None  # donated by the first step
    for _ in range(settings.warmup):
        state, _ = step_fn(state, subject.inputs_AxBxT, subject.targets_AxBxT)
    jax.block_until_ready(state)
    state, plain = timed_steps(step_fn, state, subject, settings.steps)
    peak_bytes = _peak_bytes_in_use(devices)

    median_step = statistics.median(plain.step_seconds)
    versions = ckpt_record.library_versions()
    result = {
        'command': command_line(),
        'measured_at': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
        'model_family': config.model_family,
        'model': config.model,
        'weights': subject.setup.source,
        'num_parameters': model_config.num_parameters,
        'dtype': config.dtype,
        'attention': resolve_attention(
            config.attention,
            DTYPES[config.dtype],
            deterministic=deterministic,
            scan_layers=config.scan_layers,
            seq_len=config.sequence_length,
            num_devices=len(devices),
        ),
        'cross_entropy': subject.parts.cross_entropy,
        'devices': len(devices),
        'device_kind': devices[0].device_kind,
        'platform': devices[0].platform,
        'batch_size': geometry.batch_size,
        'sequence_length': geometry.sequence_length,
        'accumulation': geometry.accumulation,
        'tokens_per_step': geometry.tokens_per_step,
        'deterministic': deterministic,
        'config_deterministic': config.deterministic,
        'xla_flags': os.environ.get('XLA_FLAGS', ''),
        'warmup_steps': settings.warmup,
        'timed_steps': settings.steps,
        'trace_lower_s': lowered_at - began,
        'compile_s': compiled_at - began,
        'step_ms': [1e3 * s for s in plain.step_seconds],
        'median_step_ms': 1e3 * median_step,
        'tokens_per_s': geometry.tokens_per_step / median_step,
        'flops_per_token': training_flops_per_token(
            config.model_family, model_config, geometry.sequence_length
        ),
        'peak_bytes_in_use': peak_bytes,
        'first_loss': plain.losses[0],
        'last_loss': plain.losses[-1],
        'versions': versions,
    }
    if settings.save_every:
        state, numbers = measure_checkpoints(subject, step_fn, state, settings, plain, versions)
        result.update(numbers)
    if settings.profile_steps:

        def run_steps(count):
            nonlocal state
            for _ in range(count):
                state, _ = step_fn(state, subject.inputs_AxBxT, subject.targets_AxBxT)
            jax.block_until_ready(state)

        kernels = kernel_profile.profile(run_steps, settings.profile_steps)
        result['profile_steps'] = settings.profile_steps
        result['kernel_ms_per_step'] = kernels.ms_per_step
        result['kernel_calls_per_step'] = kernels.calls_per_step
        result['kernel_lines'] = kernels.lines()

    # MFU as the training log computes it: 6N + 12LTC per token against the data sheet's peak
    # (None where the device has none in train/progress.py's table and --peak_tflops is not given).
    meter = MFUMeter(
        config.model_family,
        model_config,
        geometry.sequence_length,
        geometry.tokens_per_step,
        devices,
        config.dtype,
        config.peak_tflops,
    )
    result['mfu'] = meter.of(median_step)
    result['peak_flops_per_device'] = None if meter.peak_flops is None else meter.peak_flops / len(devices)
    result['model_flops_per_s_per_device'] = result['flops_per_token'] * result['tokens_per_s'] / len(devices)
    # The matmul last, with the training state gone: its buffers must not count in the
    # training memory peak, nor the state crowd the matmul.
    del state
    result.update(measure_matmul_flops(settings.matmul_size))
    return result


# --- the printed block ------------------------------------------------------------------------
