r"""Benchmark the trainer's own train step: speed, MFU, memory, and what checkpoints cost.

  python -m jaxtrain.bench --config=configs/gpt2.py:d12 --config.dtype=bfloat16 \
      --config.batch_size=16 --config.sequence_length=1024 --config.total_batch_size=16384 \
      [--warmup 3] [--steps 10] [--save_every 5] [--json bench.json]

builds the model, optimizer and state as train.run does, feeds the jitted train step one
synthetic batch of the configured geometry (random token ids, no shard), and prints one
block: compile seconds, median ms/step, tokens/s, MFU, peak device memory, the first and
last timed loss. The command above is the shape of the GPU reference figures in BENCHMARKS.md
(GPT-2 124M, bf16, batch 16 x 1024; llm.c's CUDA trainer runs it at about 471K tokens/s on an H200).

MFU is llm.c's: flops_per_token(T) x tokens/s / (peak x devices), where the peak is
measured in the same process by a bf16 matmul (8192^3 on GPU, 1024^3 on CPU), so a noisy
shared machine moves both numbers together. The peak is the burst rate (about 790 TFLOP/s on an H200);
the sustained rate (lower on an H200: power-limited) is printed beside it.

--profile_steps N traces N more steps with jax.profiler after the timed phases and prints
the device time per kernel and per kind (matmul, attention, fusion, copy): kernel_profile.py.

--save_every N adds a second timed phase of --steps steps that starts an asynchronous
save every N steps (the trainer's Checkpointer: device snapshot, checksums, Orbax, the
trainer-state JSON) into a temporary directory, after one untimed warm-up save. It reports
how long each save blocked the loop, how long one write takes in the background, the
throughput with saves against the phase without, and the time to restore the newest. Saves closer together
than one write wait for each other: on an H200, d12 writes its 1.4 GB in about 1 s, i.e.
20 steps of 50 ms, so measure the steady state there with e.g. --steps 90 --save_every 30.

Deterministic kernels are chosen by config.deterministic exactly as jaxtrain.main does
(`--deterministic true`; 'auto' is off here, since the benchmark's own saves do not count);
XLA reads its flags once, when the backend starts, so one process runs one mode, and the
block prints it with the XLA_FLAGS in effect. --compare_deterministic runs the benchmark
twice in child processes, fast then deterministic, and prints the ratio.

--smoke (CI): the family's tiny model, 1 warmup + 2 steps, a save every step, a 256^3 matmul.
"""

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from jaxtrain.checkpoint import manager as ckpt_manager
from jaxtrain.checkpoint import resume as ckpt_resume
from jaxtrain.checkpoint import trainer_state as ckpt_record
from jaxtrain.train import deterministic_flag
from jaxtrain.tools import kernel_profile, pipeline_bench
from jaxtrain.parallel import sharding
from jaxtrain.config import flags as key_flags
from jaxtrain.config.checks import deterministic_wanted
from jaxtrain.models.setup import DTYPES
from jaxtrain.models.attention import resolve_attention
from jaxtrain.train.optim import learning_rate_at
from jaxtrain.train.step import TrainState
from jaxtrain.train.setup import TrainerSetup, build_trainer

_DEFAULT_CONFIG = str(Path(__file__).resolve().parents[2] / 'configs' / 'gpt2.py')
config_flags.DEFINE_config_file(
    'config', _DEFAULT_CONFIG, 'config file, e.g. configs/gpt2.py:d12', lock_config=True
)
_WARMUP = flags.DEFINE_integer('warmup', 3, 'untimed steps after compilation')
_STEPS = flags.DEFINE_integer('steps', 10, 'timed steps per phase (the saving phase runs as many)')
_SAVE_EVERY = flags.DEFINE_integer(
    'save_every', 0, 'also time a phase with an async checkpoint every N steps, then a restore (0 = off)'
)
_SAVE_DIR = flags.DEFINE_string(
    'save_dir', '', "where --save_every writes ('' = a temporary directory, deleted afterwards)"
)
_MATMUL_SIZE = flags.DEFINE_integer(
    'matmul_size', 0, 'n of the n^3 bf16 matmul that measures peak FLOP/s (0 = 8192 on GPU, 1024 else)'
)
_JSON = flags.DEFINE_string('json', None, 'also write every number to this JSON file')
_PROFILE_STEPS = flags.DEFINE_integer(
    'profile_steps', 0, 'also trace this many steps with jax.profiler and print the device time per kernel'
)
_SMOKE = flags.DEFINE_boolean(
    'smoke', False, 'CI: tiny model, 1 warmup + 2 steps, save_every 1, 256^3 matmul (explicit flags win)'
)
_COMPARE = flags.DEFINE_boolean(
    'compare_deterministic',
    False,
    'run the benchmark twice in child processes (deterministic false, then true) and print the ratio',
)
_VERBOSE = flags.DEFINE_boolean('verbose', False, "print a traceback with errors, and Orbax's INFO log")
_KEY_FLAGS = key_flags.define_key_flags()

_SMOKE_SETTINGS = {'warmup': 1, 'steps': 2, 'save_every': 1, 'matmul_size': 256}
_MATMUL_SAMPLES = 5  # burst samples


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


def _settings() -> Settings:
    """The bench flags, with --smoke's values for those not given explicitly."""

    def value(name, flag):
        if _SMOKE.value and not flags.FLAGS[name].present:
            return _SMOKE_SETTINGS[name]
        return flag.value

    settings = Settings(
        warmup=value('warmup', _WARMUP),
        steps=value('steps', _STEPS),
        save_every=value('save_every', _SAVE_EVERY),
        save_dir=_SAVE_DIR.value,
        matmul_size=value('matmul_size', _MATMUL_SIZE),
        smoke=_SMOKE.value,
        profile_steps=_PROFILE_STEPS.value,
    )
    numbers = (
        settings.warmup,
        settings.steps,
        settings.save_every,
        settings.matmul_size,
        settings.profile_steps,
    )
    if min(numbers) < 0 or settings.steps < 1:
        raise BenchError(
            'expected --warmup >= 0, --steps >= 1, --save_every >= 0, --matmul_size >= 0, '
            f'--profile_steps >= 0; found {", ".join(map(str, numbers))}'
        )
    if settings.save_every > settings.steps:
        raise BenchError(
            f'--save_every: expected at most --steps ({settings.steps}) so the saving phase saves at '
            f'least once; found {settings.save_every}. Raise --steps or lower --save_every.'
        )
    return settings


# --- measurements -----------------------------------------------------------------------------


def measure_matmul_flops(size: int) -> dict:
    """FLOP/s of a bf16 size^3 matmul on the first device, two ways.

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
        'peak_flops': statistics.median(burst),
        'sustained_flops': statistics.median(sustained),
    }


def _peak_bytes_in_use(devices) -> int | None:
    """The largest peak over the devices; None where the backend keeps no statistics (CPU)."""
    peaks = [(d.memory_stats() or {}).get('peak_bytes_in_use') for d in devices]
    return max(peaks) if all(p is not None for p in peaks) else None


def _directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob('*') if f.is_file())


@dataclasses.dataclass
class Subject:
    """The trainer's pieces (trainer_setup.py) and one synthetic batch."""

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
    """What train.run builds (trainer_setup.build_trainer: mesh, model, optimizer, state,
    the jitted step); the data is one window of random ids, reused every step."""
    parts = build_trainer(config)
    state, parts.state = parts.state, None
    geometry, model_config = parts.geometry, parts.setup.model_config
    # Ids below the real vocabulary, shifted by one into targets as data.py's window is.
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
        checkpointer = ckpt_manager.Checkpointer(root, keep_latest=config.max_checkpoint_keep or 2, keep_every=0)
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
        restored = ckpt_resume.restore(newest, state.params, state.opt_state)
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
        'command': _command_line(),
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
        'flops_per_token': model_config.flops_per_token(config.sequence_length),
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

    # Peak FLOP/s last, with the training state gone: its buffers must not count in the
    # training memory peak, nor the state crowd the matmul.
    del state
    result.update(measure_matmul_flops(settings.matmul_size))
    achieved = result['flops_per_token'] * result['tokens_per_s'] / len(devices)
    result['mfu'] = achieved / result['peak_flops']
    result['mfu_of_sustained'] = achieved / result['sustained_flops']
    return result


# --- the printed block ------------------------------------------------------------------------


def _command_line() -> str:
    return ' '.join(['python -m jaxtrain.bench', *sys.argv[1:]])


def _mode_line(r: dict) -> str:
    mode = 'deterministic' if r['deterministic'] else 'fast (non-deterministic kernels allowed)'
    return f"{mode} | config.deterministic={r['config_deterministic']} | XLA_FLAGS={r['xla_flags']!r}"


def summary(r: dict) -> str:
    memory = (
        f"peak {r['peak_bytes_in_use'] / 2**20:,.0f} MiB in use (largest over devices)"
        if r['peak_bytes_in_use'] is not None
        else 'not reported by this backend'
    )
    steps = r['step_ms']
    lines = [
        f"command     {r['command']}",
        (
            f"jaxtrain.bench | {r['model_family']} {r['model']} | {r['num_parameters']:,} parameters | "
            f"{r['weights']} | {r['dtype']} | attention {r['attention']}"
        ),
        (
            f"devices     {r['devices']} x {r['device_kind']} ({r['platform']}) | batch {r['batch_size']} x "
            f"{r['sequence_length']} x DP {r['devices']} x accumulation {r['accumulation']} = "
            f"{r['tokens_per_step']:,} tokens/step"
        ),
        f'mode        {_mode_line(r)}',
        f"compile     {r['compile_s']:.2f} s (trace + lower {r['trace_lower_s']:.2f} s)",
        (
            f"step        median {r['median_step_ms']:.2f} ms (min {min(steps):.2f}, max "
            f"{max(steps):.2f}) over {r['timed_steps']} steps after {r['warmup_steps']} warmup"
        ),
        (
            f"throughput  {r['tokens_per_s']:,.0f} tokens/s | MFU {100 * r['mfu']:.1f}% "
            f"({r['flops_per_token'] / 1e6:.1f} MFLOP/token, llm.c's count)"
        ),
        (
            f"peak        {r['peak_flops'] / 1e12:.2f} TFLOP/s per device, burst (bf16 {r['matmul_size']}^3 "
            f"matmul); {r['sustained_flops'] / 1e12:.2f} sustained, of which this is "
            f"{100 * r['mfu_of_sustained']:.1f}%"
        ),
        f'memory      {memory}',
        f"loss        first timed {r['first_loss']:.6f}, last timed {r['last_loss']:.6f}",
    ]
    lines += r.get('kernel_lines', [])
    if 'save_every' in r:
        lines.append(
            f"checkpoints every {r['save_every']} step(s), async Orbax, "
            f"{r['checkpoint_bytes'] / 1e6:,.1f} MB each, under {r['save_dir']}"
        )
        for step, blocked, pct in zip(r['saved_steps'], r['save_blocked_ms'], r['save_blocked_pct_of_step']):
            lines.append(f'  step {step:<6d}blocked {blocked:8.1f} ms ({pct:.1f}% of a step)')
        if r['blocking_saves']:
            lines.append(
                f"  {r['blocking_saves']} save(s) copied off the device while the loop waited (no device "
                'memory for a snapshot, or several processes)'
            )
        lines += [
            (
                f"  first     save blocked {r['warmup_save_blocked_ms']:.1f} ms (warm-up, untimed); "
                f"its write took {r['write_s']:.2f} s more in the background"
            ),
            (
                f"  phase     {r['phase_tokens_per_s_with_saves']:,.0f} tokens/s with saves vs "
                f"{r['phase_tokens_per_s_without_saves']:,.0f} without ({r['saving_throughput_ratio']:.3f}x, "
                f"wall time of {r['timed_steps']} steps each)"
            ),
            (
                f"  restore   newest {r['restore_s']:.2f} s (checksums verified) | last write drained "
                f"in {r['drain_s']:.2f} s"
            ),
        ]
    return '\n'.join(lines)


# --- --compare_deterministic ------------------------------------------------------------------


def _child_argv(argv: list[str]) -> list[str]:
    """The command line minus --compare_deterministic and --json (each child gets its own)."""
    kept, skip_next = [], False
    for arg in argv:
        if skip_next:
            skip_next = False
        elif re.fullmatch(r'--(no)?compare_deterministic(=.*)?', arg):
            pass
        elif arg == '--json':
            skip_next = True
        elif not arg.startswith('--json='):
            kept.append(arg)
    return kept


def compare_deterministic(argv: list[str]) -> dict:
    """Runs fast then deterministic in child processes (one XLA backend each)."""
    env = dict(os.environ)
    # The fast child must not inherit the flag; each child sets it from --deterministic.
    env['XLA_FLAGS'] = ' '.join(
        f for f in env.get('XLA_FLAGS', '').split() if not f.startswith(deterministic_flag.FLAG)
    )
    repo = str(Path(__file__).resolve().parents[2])
    env['PYTHONPATH'] = os.pathsep.join(p for p in (repo, env.get('PYTHONPATH', '')) if p)
    results = {}
    with tempfile.TemporaryDirectory(prefix='jaxtrain-bench-compare-') as tmp:
        for name, value in (('fast', 'false'), ('deterministic', 'true')):
            out = Path(tmp) / f'{name}.json'
            command = [sys.executable, '-m', 'jaxtrain.bench', *_child_argv(argv)]
            command += [f'--deterministic={value}', f'--json={out}']  # last: wins over --config.*
            print(f'--- {name}: {" ".join(command[1:])}', flush=True)
            code = subprocess.run(command, env=env, check=False).returncode
            if code:
                raise BenchError(f'the {name} child exited with status {code}; its output is above')
            results[name] = json.loads(out.read_text())
    fast, deterministic = results['fast'], results['deterministic']
    return {
        'command': _command_line(),
        'fast': fast,
        'deterministic': deterministic,
        'tokens_per_s_ratio': deterministic['tokens_per_s'] / fast['tokens_per_s'],
        'step_ms_ratio': deterministic['median_step_ms'] / fast['median_step_ms'],
    }


def compare_summary(c: dict) -> str:
    fast, det = c['fast'], c['deterministic']
    return '\n'.join(
        [
            f"jaxtrain.bench --compare_deterministic (same machine, fast first) | {c['command']}",
            (
                f"  fast           {fast['median_step_ms']:.2f} ms/step  "
                f"{fast['tokens_per_s']:,.0f} tokens/s  MFU {100 * fast['mfu']:.1f}%  "
                f"XLA_FLAGS={fast['xla_flags']!r}"
            ),
            (
                f"  deterministic  {det['median_step_ms']:.2f} ms/step  "
                f"{det['tokens_per_s']:,.0f} tokens/s  MFU {100 * det['mfu']:.1f}%  "
                f"XLA_FLAGS={det['xla_flags']!r}"
            ),
            (
                f"  ratio          deterministic / fast: {c['tokens_per_s_ratio']:.3f}x tokens/s "
                f"({c['step_ms_ratio']:.3f}x ms/step)"
            ),
        ]
    )


# --- entry point ------------------------------------------------------------------------------


def main(argv):
    if len(argv) > 1:
        print(
            f'error: unexpected arguments {argv[1:]}; flags look like --KEY VALUE or --config.KEY=VALUE',
            file=sys.stderr,
        )
        return 2
    if not _VERBOSE.value:
        logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO: pages per checkpoint
    try:
        settings = _settings()
        if _COMPARE.value:
            result = compare_deterministic(sys.argv[1:])
            text = compare_summary(result)
        else:
            config = flags.FLAGS.config
            key_flags.apply_key_flags(config, _KEY_FLAGS, warn=print)
            if settings.smoke:
                config.model, config.llmc_filepath = 'tiny', ''
            deterministic_flag.request(deterministic_wanted(config))
            # What runs is what XLA_FLAGS says: an inherited flag wins over the config.
            deterministic = deterministic_flag.in_effect()
            if deterministic != deterministic_wanted(config):
                print(
                    f'warning: config.deterministic={config.deterministic}, but the inherited XLA_FLAGS '
                    f'decide: this run is {"deterministic" if deterministic else "fast"}',
                    file=sys.stderr,
                )
            result = run_benchmark(config, settings, deterministic)
            text = summary(result) + pipeline_bench.report(config, settings.warmup, settings.steps)
        print(text, flush=True)
        if _JSON.value:
            Path(_JSON.value).write_text(json.dumps(result, indent=2) + '\n')
        return 0
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return 130
    except Exception as e:  # one line for people; the traceback on request
        if _VERBOSE.value:
            traceback.print_exc()
        message = str(e).strip().splitlines()[0] if str(e).strip() else ''
        print(
            f'error: {message or type(e).__name__} ({type(e).__name__}; --verbose for a traceback)',
            file=sys.stderr,
        )
        return 1


def entry_point():
    from jaxtrain.config.config_path import resolve_config_argument  # --config from any directory

    app.run(
        lambda argv: sys.exit(main(argv)),
        flags_parser=lambda argv: app.parse_flags_with_usage(resolve_config_argument(argv)),
    )


if __name__ == '__main__':
    entry_point()
