r"""Benchmark the trainer's own train step: speed, MFU, memory, and what checkpoints cost.

  python -m jaxtrain.bench --config=configs/gpt2.py:d12 --config.dtype=bfloat16 \
      --config.batch_size=16 --config.sequence_length=1024 --config.total_batch_size=16384 \
      [--warmup 3] [--steps 10] [--save_every 5] [--json bench.json]

builds the model, optimizer and state as train.run does, feeds the jitted train step one
synthetic batch of the configured geometry (random token ids, no shard), and prints one
block: compile seconds, median ms/step, tokens/s, MFU, peak device memory, the first and
last timed loss. The command above is the shape of the GPU figures in BENCHMARKS.md
(GPT-2 124M, bf16, batch 16 x 1024; llm.c's CUDA trainer runs it at about 471K tokens/s on an H200).

MFU is the training log's (docs/dashboards.md): (6·N + 12·L·T·C) FLOPs per token,
N without the input embedding, x tokens/s / (devices x the data sheet's dense peak for the dtype:
989.4 TFLOP/s bf16 on an H200), so that it compares with the published MFU of other trainers. A
device not in the table (a CPU) has none unless --peak_tflops is given. Beside it, a bf16 matmul
(8192^3 on GPU, 1024^3 on CPU) measures what the device delivers today: its burst rate (about 790
TFLOP/s on an H200) and its sustained rate (lower: power-limited), against the step's model TFLOP/s.

--profile_steps N traces N more steps with jax.profiler after the timed phases and prints
the device time per kernel and per kind (matmul, attention, fusion, copy).

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

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

from jaxtrain.config import flags as key_flags
from jaxtrain.checks.config_checks import check_config, deterministic_wanted
from jaxtrain.config.keys import shipped_config
from jaxtrain.parallel import platform
from jaxtrain.tools import pipeline_bench
from jaxtrain.tools.bench_measure import BenchError, Settings, command_line, run_benchmark
from jaxtrain.config.flags import quiet_absl
from llmc_io.atomic_file import write_text_atomically

_DEFAULT_CONFIG = str(shipped_config('gpt2.py') or 'configs/gpt2.py')  # the checkout's or the install's
# absl heads --help's flag list with the defining module's name, which for __main__ is argv[0]
# (runpy makes it this file's path): the command's name instead.
if __name__ == '__main__':
    sys.argv[0] = 'python -m jaxtrain.bench'
config_flags.DEFINE_config_file(
    'config', _DEFAULT_CONFIG, 'config file, e.g. configs/gpt2.py:d12', lock_config=True
)
flags.FLAGS['config'].default_as_str = "'configs/gpt2.py'"  # --help: not this checkout's path
_WARMUP = flags.DEFINE_integer('warmup', 3, 'untimed steps after compilation')
_STEPS = flags.DEFINE_integer('steps', 10, 'timed steps per phase (the saving phase runs as many)')
_SAVE_EVERY = flags.DEFINE_integer(
    'save_every', 0, 'also time a phase with an async checkpoint every N steps, then a restore (0 = off)'
)
_SAVE_DIR = flags.DEFINE_string(
    'save_dir', '', "where --save_every writes ('' = a temporary directory, deleted afterwards)"
)
_MATMUL_SIZE = flags.DEFINE_integer(
    'matmul_size',
    0,
    "n of the n^3 bf16 matmul that shows the device's delivered FLOP/s (0 = 8192 on GPU, 1024 else)",
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
    if r['mfu'] is None:
        mfu = f"MFU unknown: no data-sheet peak for {r['device_kind']}, give --peak_tflops"
    else:
        mfu = f"MFU {100 * r['mfu']:.1f}% of {r['peak_flops_per_device'] / 1e12:.1f} TFLOP/s per device"
    lines = [
        f"command     {r['command']}",
        (
            f"jaxtrain.bench | {r['model_family']} {r['model']} | {r['num_parameters']:,} parameters | "
            f"{r['weights']} | {r['dtype']} | attention {r['attention']} | cross-entropy {r['cross_entropy']}"
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
            f"throughput  {r['tokens_per_s']:,.0f} tokens/s | {mfu} | "
            f"{r['flops_per_token'] / 1e6:.1f} MFLOP/token (6N + 12LTC)"
        ),
        (
            f"matmul      the step's model FLOPs at {r['model_flops_per_s_per_device'] / 1e12:.4g} TFLOP/s "
            f"per device; a bf16 {r['matmul_size']}^3 matmul at {r['matmul_burst_flops'] / 1e12:.4g} "
            f"burst, {r['matmul_sustained_flops'] / 1e12:.4g} sustained"
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
        f for f in env.get('XLA_FLAGS', '').split() if not f.startswith(platform.DETERMINISTIC_FLAG)
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
        'command': command_line(),
        'fast': fast,
        'deterministic': deterministic,
        'tokens_per_s_ratio': deterministic['tokens_per_s'] / fast['tokens_per_s'],
        'step_ms_ratio': deterministic['median_step_ms'] / fast['median_step_ms'],
    }


def _mfu_text(r: dict) -> str:
    return 'MFU unknown' if r['mfu'] is None else f"MFU {100 * r['mfu']:.1f}%"


def compare_summary(c: dict) -> str:
    fast, det = c['fast'], c['deterministic']
    return '\n'.join(
        [
            f"jaxtrain.bench --compare_deterministic (same machine, fast first) | {c['command']}",
            (
                f"  fast           {fast['median_step_ms']:.2f} ms/step  "
                f"{fast['tokens_per_s']:,.0f} tokens/s  {_mfu_text(fast)}  "
                f"XLA_FLAGS={fast['xla_flags']!r}"
            ),
            (
                f"  deterministic  {det['median_step_ms']:.2f} ms/step  "
                f"{det['tokens_per_s']:,.0f} tokens/s  {_mfu_text(det)}  "
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
    with quiet_absl(not _VERBOSE.value):  # Orbax's normal warnings; --verbose shows them
        return _run(argv)


def _run(argv):
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
            platform.request_deterministic(deterministic_wanted(config))
            # What runs is what XLA_FLAGS says: an inherited flag wins over the config.
            deterministic = platform.deterministic_in_effect()
            if deterministic != deterministic_wanted(config):
                print(
                    f'warning: config.deterministic={config.deterministic}, but the inherited XLA_FLAGS '
                    f'decide: this run is {"deterministic" if deterministic else "fast"}',
                    file=sys.stderr,
                )
            check_config(config)
            result = run_benchmark(config, settings, deterministic)
            text = summary(result) + pipeline_bench.report(config, settings.warmup, settings.steps)
        print(text, flush=True)
        if _JSON.value:
            write_text_atomically(_JSON.value, json.dumps(result, indent=2) + '\n')
        return 0
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return 130
    except Exception as e:  # one line for people; the traceback on request
        return key_flags.report_error(e, _VERBOSE.value)


def entry_point():
    from jaxtrain.config.keys import resolve_config_argument  # --config from any directory

    app.run(
        lambda argv: sys.exit(main(argv)),
        flags_parser=lambda argv: key_flags.exit_zero_after_help(
            app.parse_flags_with_usage, resolve_config_argument(argv)
        ),
    )


if __name__ == '__main__':
    entry_point()
