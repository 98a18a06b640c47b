"""Every figure BENCHMARKS.md reports, measured in one call so that each ratio is to a run beside it.

    python bench/figures.py OUT_DIR                       # every figure this machine can run
    python bench/figures.py OUT_DIR --figures loop,peers  # a few of them
    python bench/figures.py --list                        # the figures, what each runs, what it needs

Each figure prints one line and appends its numbers to OUT_DIR/figures.jsonl; the runs' own logs
and metrics stay under OUT_DIR. The GPU figures are GPT-2 124M (d12, random init), bf16, batch
16 x 1024, no accumulation, unrolled layers, on a random llm.c token shard, as the peers run it.
The llama figures are LLaMA-3.2 1B's shape (configs/llama3.py:llama3.2-1b, random init), bf16,
batch 4 x 2048, no accumulation, unrolled layers, on a random LLaMA-3 token shard; their peer is
llm.c's PyTorch train_llama3.py, patched to run offline (bench/peers/train_llama3.py, its header
says how). MFU is the training log's everywhere: 6N + 12LTC FLOPs a token, N without the input
embedding, against the data sheet's dense peak (docs/dashboards.md).

The peers (llm.c's CUDA trainer with cuDNN, PyTorch's llm.c train_gpt2.py with torch.compile, and a
plain 40-line JAX step) come from ../shared/peers, which the GPU machine does not see: copy it into
the ignored .peers/ of the checkout (`cp -r ../shared/peers .peers`) and carry .peers along. Their
llm.c build (about 90 s of CPU) starts first and runs while the other figures are measured.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The peers (llm.c, its PyTorch trainer, plain_jax_step.py) are reference material kept outside the
# repository: copy them into .peers, which git ignores, and carry it to the GPU machine.
PEERS = REPO / '.peers'
SHARD = Path('/tmp/jaxtrain_bench/train.bin')  # random GPT-2 tokens, written once
LLAMA_SHARD = Path('/tmp/jaxtrain_bench/llama3_train.bin')  # random LLaMA-3 tokens, written once
TOKENS_PER_STEP = 16 * 1024
LLAMA_TOKENS_PER_STEP = 4 * 2048
PEER_STEPS = 30  # the PyTorch peers' steps; their median leaves out the first 5
PEER_PYTHON = 'python3'  # the PyTorch peers' interpreter, as run_peers.sh runs train_gpt2.py
SKIP = 10  # steps left out of a loop's figures: compilation and warm-up


def _loop_flags(config: str, batch: int, sequence: int) -> list:
    """python -m jaxtrain.main's flags for a figure's loop: bf16, unrolled layers, no samples,
    fast mode, one micro-step a step."""
    return [
        f'--config={config}',
        '--dtype',
        'bfloat16',
        '--batch_size',
        str(batch),
        '--sequence_length',
        str(sequence),
        '--total_batch_size',
        str(batch * sequence),
        '--scan_layers',
        'false',
        '--sample_every',
        '0',
        '--deterministic',
        'false',
    ]


def _step_flags(config: str, batch: int, sequence: int) -> list:
    """python -m jaxtrain.bench's flags for the same step alone."""
    return [
        f'--config={config}',
        '--config.dtype=bfloat16',
        f'--config.batch_size={batch}',
        f'--config.sequence_length={sequence}',
        f'--config.total_batch_size={batch * sequence}',
        '--config.scan_layers=false',
    ]


GPT2 = _loop_flags('configs/gpt2.py:d12', 16, 1024)  # the loop
BENCH = _step_flags('configs/gpt2.py:d12', 16, 1024)  # its step alone
DECODE = [  # python -m jaxtrain.generate with these, and --num_samples 1 or 16
    '--model',
    'd12',
    '--dtype',
    'bfloat16',
    '--max_new_tokens',
    '256',
    '--warmup_runs',
    '1',
]
LLAMA_LOOP = _loop_flags('configs/llama3.py:llama3.2-1b', 4, 2048)  # LLaMA-3.2 1B's loop
LLAMA = _step_flags('configs/llama3.py:llama3.2-1b', 4, 2048)  # its step alone
LLAMA_PEER = [  # its PyTorch peer: python3 bench/peers/train_llama3.py with these
    '--model',
    'llama3.2-1b',
    '--input_bin',
    str(LLAMA_SHARD),
    '--batch_size',
    '4',
    '--sequence_length',
    '2048',
    '--total_batch_size',
    str(LLAMA_TOKENS_PER_STEP),
    '--num_iterations',
    str(PEER_STEPS),
    '--compile',
    '1',
    '--tensorcores',
    '1',
    '--dtype',
    'bfloat16',
    '--overfit_single_batch',
    '0',
]


class Call:
    """One benchmark call: its output folder, its figures so far, and the peers' build."""

    def __init__(self, out: Path, steps: int, device: str = 'cpu'):
        self.out, self.steps, self.found = out, steps, {}
        self.device = device  # the GPU's name (nvidia-smi's), for the data sheet's peak
        self.build = None

    def run(self, name: str, command: list, timeout: int = 300, env=None) -> subprocess.CompletedProcess:
        """Runs command from the repository, its output into OUT/name.txt."""
        log = self.out / f'{name}.txt'
        with open(log, 'w') as f:
            f.write(' '.join(command) + '\n')
            f.flush()
            try:
                return subprocess.run(
                    command,
                    cwd=REPO,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    env={**os.environ, 'PYTHONPATH': _python_path(), **(env or {})},
                    check=False,
                )
            except subprocess.TimeoutExpired:
                f.write(f'\ntimed out after {timeout} s\n')
                return subprocess.CompletedProcess(command, 124)

    def record(self, figure: str, values: dict) -> None:
        self.found[figure] = values
        with open(self.out / 'figures.jsonl', 'a') as f:
            f.write(json.dumps({'figure': figure, **values}) + '\n')
        print(f'{figure}: ' + ', '.join(f'{k} {v}' for k, v in values.items()), flush=True)

    def loop(self, name: str, *flags: str, model=GPT2, shard=SHARD, tokens=TOKENS_PER_STEP) -> dict:
        """The real training loop for self.steps steps; its figures from metrics.jsonl."""
        metrics = self.out / name
        done = self.run(
            name,
            [
                sys.executable,
                '-m',
                'jaxtrain.main',
                *model,
                '--input_bin',
                str(shard),
                '--num_iteration',
                str(self.steps),
                '--metrics_dir',
                str(metrics),
                *flags,
            ],
        )
        if done.returncode:
            raise RuntimeError(f'{name}: exit {done.returncode}; see {self.out / name}.txt')
        return loop_figures(metrics / 'metrics.jsonl', tokens=tokens)

    def bench(self, name: str, *flags: str, env=None, timeout: int = 300) -> dict:
        """jaxtrain.bench's result (its --json) for the given flags."""
        result = self.out / f'{name}.json'
        done = self.run(
            name, [sys.executable, '-m', 'jaxtrain.bench', *flags, '--json', str(result)], env=env
        )
        if done.returncode or not result.exists():
            raise RuntimeError(f'{name}: exit {done.returncode}; see {self.out / name}.txt')
        return json.loads(result.read_text())


def _python_path() -> str:
    """The repository first, so that children import this checkout's jaxtrain and configs/."""
    return os.pathsep.join([str(REPO), *filter(None, [os.environ.get('PYTHONPATH')])])


def loop_figures(path: Path, skip: int = SKIP, tokens: int = TOKENS_PER_STEP) -> dict:
    """The median of a run's step lines after step `skip`, and the wall clock between the records
    of step `skip` and the last step (every host action included, as a user waits for it)."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    steps = {r['step']: r for r in rows if 'loss' in r}
    last = max(steps, default=0)
    if skip not in steps or last <= skip:
        raise RuntimeError(f'{path}: expected step records after step {skip}, found steps up to {last}')
    after = [steps[s]['step_ms'] for s in sorted(steps) if s > skip]
    wall_ms = 1e3 * (steps[last]['time'] - steps[skip]['time']) / (last - skip)
    blocked = [1e3 * r['save_blocked_s'] for r in rows if 'save_blocked_s' in r]
    # The loop's own MFU (train/progress.py), absent where the device has no data-sheet peak.
    mfu = [steps[s]['mfu'] for s in sorted(steps) if s > skip and 'mfu' in steps[s]]
    # The two steps after each save past `skip`: what a save costs the steps that follow it.
    saved = sorted(r['step'] for r in rows if 'save_blocked_s' in r and skip < r['step'] < last)
    after_saves = [steps[s + k]['step_ms'] for s in saved for k in (1, 2) if s + k in steps]
    median = statistics.median(after)
    return {
        'median_step_ms': round(median, 3),
        'wall_ms_per_step': round(wall_ms, 3),
        'tokens_per_s': round(tokens / wall_ms * 1e3),
        'MFU': round(statistics.median(mfu), 4) if len(mfu) == len(after) else None,
        'save_blocked_ms_max': round(max(blocked), 2) if blocked else None,
        'after_save_ms': [round(ms, 1) for ms in after_saves] or None,
        'after_save_worst_vs_median': round(max(after_saves) / median, 3) if after_saves else None,
        'losses': [steps[s]['loss'] for s in sorted(steps)],
    }


def peer_line(text: str, name: str) -> float | None:
    """The median ms/step of a peer's line '<name> B=<B> median <ms> ms/step <tok/s> tok/s'."""
    for line in text.splitlines():
        if line.startswith(f'{name} B=') and ' median ' in line and 'ms/step' in line:
            return float(line.split(' median ')[1].split()[0])
    return None


PLAIN_JAX = 'plain JAX step'  # plain_jax_step.py's line starts at 'B=', with no name


def peer_steps(lines: list[str]) -> dict[str, float]:
    """Each peer's median ms/step, by name, from lines '<name> B=<B> [<variant>] median <ms> ms/step
    ...' (run_peers.sh's) or 'B=<B> <variant> median <ms> ms/step ...' (plain_jax_step.py's); other
    lines, such as a log line that happens to say 'median' and 'ms/step', are skipped."""
    found = {}
    for line in lines:
        if ' median ' not in line or 'ms/step' not in line:
            continue
        if line.startswith('B='):
            name, rest = '', line
        elif ' B=' in line:
            name, rest = line.split(' B=', 1)
        else:
            continue
        found[name or PLAIN_JAX] = float(rest.split(' median ')[1].split()[0])
    return found


def llama_mfu(step_ms: float, device: str) -> float | None:
    """MFU of a LLaMA-3.2 1B step of LLAMA_TOKENS_PER_STEP tokens on one device, by train/progress.py."""
    from jaxtrain.models.llama3 import VARIANTS
    from jaxtrain.train.progress import peak_flops_per_device, training_flops_per_token

    peak = peak_flops_per_device(device, 'bfloat16')
    if peak is None:
        return None
    flops = training_flops_per_token('llama3', VARIANTS['llama3.2-1b'], 2048) * LLAMA_TOKENS_PER_STEP
    return flops / (step_ms / 1e3) / peak


# --- the figures ----------------------------------------------------------------------------------


def peers(call: Call) -> None:
    if call.build is None:
        raise RuntimeError('expected .peers/ (a copy of ../shared/peers); found none')
    call.build.wait()
    done = call.run('peers', ['bash', str(PEERS / 'run_peers.sh'), 'run', str(call.out / 'peers'), '16'])
    lines = (call.out / 'peers.txt').read_text().splitlines()
    plain = call.run('plain_jax_step', [sys.executable, str(PEERS / 'plain_jax_step.py'), '16'])
    lines += (call.out / 'plain_jax_step.txt').read_text().splitlines()
    found = peer_steps(lines)
    if not found:
        raise RuntimeError(
            f'no peer reported a step (exit {done.returncode}, {plain.returncode}); see peers.txt'
        )
    call.record('peers', {f'{name} ms': ms for name, ms in found.items()})
    if 'loop' in call.found and 'llm.c+cuDNN' in found:
        loop = call.found['loop']
        call.record(
            'loop_vs_llmc',
            {
                'step lines': round(found['llm.c+cuDNN'] / loop['median_step_ms'], 3),
                'wall clock': round(found['llm.c+cuDNN'] / loop['wall_ms_per_step'], 3),
            },
        )


def loop(call: Call) -> None:
    found = call.loop('loop')
    call.record('loop', {k: v for k, v in found.items() if k != 'losses'})


def deterministic(call: Call) -> None:
    first = call.loop('deterministic', '--deterministic', 'true')
    again = call.loop('deterministic_again', '--deterministic', 'true')
    values = {
        'median_step_ms': first['median_step_ms'],
        'wall_ms_per_step': first['wall_ms_per_step'],
        'twice bitwise equal': first['losses'] == again['losses'],
    }
    if 'loop' in call.found:
        values['vs fast (wall)'] = round(
            call.found['loop']['wall_ms_per_step'] / first['wall_ms_per_step'], 3
        )
    call.record('deterministic', values)


def saves(call: Call) -> None:
    root = Path('/dev/shm/jaxtrain_bench_ck' if Path('/dev/shm').is_dir() else call.out / 'ck')
    found = call.loop(
        'saves', '--checkpoint_dir', str(root), '--save_steps', '20', '--max_checkpoint_keep', '2'
    )
    subprocess.run(['rm', '-rf', str(root)], check=False)
    values = {k: v for k, v in found.items() if k != 'losses'}
    if 'loop' in call.found:
        values['vs no saves (wall)'] = round(
            call.found['loop']['wall_ms_per_step'] / found['wall_ms_per_step'], 3
        )
    call.record('saves', values)


def save_trace(call: Call) -> None:
    """The saves loop traced from its second save (step 40) to step 43: the device time per kernel of
    those steps, and the trace (TensorBoard's profile plugin, Perfetto) to see what a save costs them."""
    root = Path('/dev/shm/jaxtrain_bench_ck' if Path('/dev/shm').is_dir() else call.out / 'ck')
    trace = call.out / 'save_trace'
    call.loop(
        'save_trace',
        *('--checkpoint_dir', str(root), '--save_steps', '20', '--max_checkpoint_keep', '2'),
        *('--trace_steps', '40-43', '--trace_dir', str(trace)),
    )
    subprocess.run(['rm', '-rf', str(root)], check=False)
    lines = (call.out / 'save_trace.txt').read_text().splitlines()
    call.record('save_trace', {'trace': str(trace), 'lines': [x for x in lines if x.startswith('trace: ')]})


def seed(call: Call) -> None:
    """Bit-exact resume in the deterministic mode: 100 steps saving every 20, resumed from 40."""
    work = call.out / 'seed'
    done = call.run(
        'seed',
        [
            'bash',
            'launch/seed_experiment.sh',
            str(work),
            'configs/gpt2.py:d12',
            '--dtype',
            'bfloat16',
            '--batch_size',
            '8',
            '--sequence_length',
            '1024',
            '--total_batch_size',
            '8192',
            '--scan_layers',
            'false',
            '--input_bin',
            str(SHARD),
        ],
        timeout=600,
        env={'STEPS': '100'},
    )
    text = (call.out / 'seed.txt').read_text()
    call.record(
        'seed', {'exit': done.returncode, 'bitwise': done.returncode == 0, 'last line': text.strip()[-120:]}
    )


def profile(call: Call) -> None:
    r = call.bench('profile', *BENCH, '--steps', '20', '--profile_steps', '3')
    call.record(
        'profile', {'median_step_ms': round(r['median_step_ms'], 3), 'kernels': r.get('kernel_lines', [])}
    )


def llama(call: Call) -> None:
    _write_shard(LLAMA_SHARD, 128256, 'llama3')
    found = call.loop('llama', model=LLAMA_LOOP, shard=LLAMA_SHARD, tokens=LLAMA_TOKENS_PER_STEP)
    call.record('llama', {k: v for k, v in found.items() if k not in ('losses', 'save_blocked_ms_max')})


def llama_peer(call: Call) -> None:
    """llm.c's PyTorch LLaMA-3 on the llama loop's shape and shard, python3 as run_peers.sh runs
    train_gpt2.py. SDPA's enable_gqa under the flash kernel first; llm.c's repeat_kv if it fails."""
    _write_shard(LLAMA_SHARD, 128256, 'llama3')
    script = str(REPO / 'bench' / 'peers' / 'train_llama3.py')
    for name, extra in (('llama_peer', []), ('llama_peer_repeat_kv', ['--sdpa_gqa', '0'])):
        done = call.run(name, [PEER_PYTHON, script, *LLAMA_PEER, *extra], timeout=400)
        ms = peer_line((call.out / f'{name}.txt').read_text(), 'pytorch-llama3')
        if ms is not None:
            break
    else:
        raise RuntimeError(f'exit {done.returncode}, no median line; see llama_peer.txt, {name}.txt')
    mfu = llama_mfu(ms, call.device)
    values = {
        'median_step_ms': ms,
        'tokens_per_s': round(LLAMA_TOKENS_PER_STEP / ms * 1e3),
        'MFU': None if mfu is None else round(mfu, 4),
        'attention': 'SDPA flash, ' + ('enable_gqa' if name == 'llama_peer' else 'repeat_kv'),
    }
    if 'llama' in call.found:
        loop = call.found['llama']
        values['loop vs pytorch (step lines)'] = round(ms / loop['median_step_ms'], 3)
        values['loop vs pytorch (wall clock)'] = round(ms / loop['wall_ms_per_step'], 3)
    call.record('llama_peer', values)


def llama_profile(call: Call) -> None:
    r = call.bench('llama_profile', *LLAMA, '--steps', '10', '--profile_steps', '3')
    call.record(
        'llama_profile',
        {
            'median_step_ms': round(r['median_step_ms'], 3),
            'MFU': None if r['mfu'] is None else round(r['mfu'], 4),
            'kernels': r.get('kernel_lines', []),
        },
    )


def lora(call: Call) -> None:
    full = call.bench('lora_full', *BENCH, '--warmup', '3', '--steps', '30', '--save_every', '15')
    adapters = call.bench(
        'lora_r8', *BENCH, '--warmup', '3', '--steps', '30', '--save_every', '15', '--config.lora_rank=8'
    )
    call.record(
        'lora',
        {
            'full ms': round(full['median_step_ms'], 2),
            'r8 ms': round(adapters['median_step_ms'], 2),
            'full MB': round(full['checkpoint_bytes'] / 1e6, 1),
            'r8 MB': round(adapters['checkpoint_bytes'] / 1e6, 1),
        },
    )


def two_gpus(call: Call) -> None:
    one = call.bench('dp1', *BENCH, '--config.num_devices=1', '--steps', '20')
    two = call.bench(
        'dp2',
        *BENCH,
        '--config.num_devices=2',
        f'--config.total_batch_size={2 * TOKENS_PER_STEP}',
        '--steps',
        '20',
    )  # the later flag wins: 16 x 1024 on each GPU
    call.record(
        'two_gpus',
        {
            '1 GPU tok/s': round(one['tokens_per_s']),
            '2 GPUs tok/s': round(two['tokens_per_s']),
            'scaling': round(two['tokens_per_s'] / one['tokens_per_s'], 3),
        },
    )


def pipeline(call: Call) -> None:
    """Tiny GPT-2 in 2 pipeline stages on fake CPU devices, 8 microbatches."""
    fake_cpus = {'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}
    call.bench(
        'pipeline',
        '--config=configs/gpt2.py:tiny',
        '--config.pipeline_parallel=2',
        '--config.num_devices=2',
        '--config.batch_size=4',
        '--config.sequence_length=64',
        '--config.total_batch_size=2048',
        '--warmup',
        '3',
        '--steps',
        '20',
        env=fake_cpus,
        timeout=900,  # eight fake devices on a few shared cores compile slowly
    )
    lines = [line.strip() for line in (call.out / 'pipeline.txt').read_text().splitlines()]
    call.record(
        'pipeline',
        {
            'memory': next((line for line in lines if line.startswith('memory/device')), None),
            'bubble': next((line for line in lines if line.startswith('bubble')), None),
        },
    )


def recompute(call: Call) -> None:
    """Activation recompute's plans (PR 154's flags): XLA's peak memory of the step, and its time."""
    done = call.run('recompute', [sys.executable, 'bench/recompute_memory.py'])
    rows = [
        json.loads(line) for line in (call.out / 'recompute.txt').read_text().splitlines() if line[:1] == '{'
    ]
    if done.returncode or not rows:
        raise RuntimeError(f'exit {done.returncode}; see {call.out / "recompute.txt"}')
    call.record('recompute', {row['plan']: f"{row['peak_MiB']} MiB, {row['step_s']} s" for row in rows})


def decode(call: Call) -> None:
    """KV-cache decoding of GPT-2 124M (random weights) in bf16, 256 new tokens from EOT at generate's
    sampling defaults: tokens/s of the run after a warm-up run, compilation excluded."""
    values = {}
    for batch in (1, 16):
        result = call.out / f'decode_b{batch}.json'
        command = [sys.executable, '-m', 'jaxtrain.generate', *DECODE, '--num_samples', str(batch)]
        done = call.run(f'decode_b{batch}', [*command, '--json', str(result)])
        if done.returncode or not result.exists():
            raise RuntimeError(
                f'decode_b{batch}: exit {done.returncode}; see {call.out / f"decode_b{batch}"}.txt'
            )
        timing = json.loads(result.read_text())
        values[f'batch {batch} tok/s'] = round(timing['tokens_per_s'])
        values[f'batch {batch} ms/position'] = round(timing['ms_per_position'], 3)
    call.record('decode', values)


def decode_variants(call: Call) -> None:
    """The decoder's levers against each other (bench/decode_variants.py): a line per variant.
    Refused when the script failed: a process that crashed, or a variant whose tokens differ from
    those it must equal."""
    rows_file = call.out / 'decode_variants.jsonl'
    done = call.run(
        'decode_variants', [sys.executable, 'bench/decode_variants.py', '--json', str(rows_file)], timeout=400
    )
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    if done.returncode or not rows:
        raise RuntimeError(f'exit {done.returncode}; see {call.out / "decode_variants.txt"}')
    call.record(
        'decode_variants',
        {f"{r['flags']}/{r['variant']}/b{r['batch']}": f"{r['tokens_per_s']:.0f} tok/s" for r in rows},
    )


def fused_kernels(call: Call) -> None:
    """--fused_kernels (the Pallas residual-add + LayerNorm and bias + GELU) against XLA's fusions:
    each kernel alone at GPT-2 124M's shapes, then the real loop with and without them, fast and
    deterministic (bench/fused_kernels.sh). Refused when the script failed, or any part of it did
    (a line with FAILED), or it printed no loop line."""
    done = call.run(
        'fused_kernels',
        ['bash', 'bench/fused_kernels.sh', str(call.out / 'fused_kernels')],
        timeout=420,
        env={'PYTHON': sys.executable},
    )
    lines = (call.out / 'fused_kernels.txt').read_text().splitlines()
    found = [
        line
        for line in lines
        if line.startswith(('micro add_layernorm best', 'micro bias_gelu best', 'loop '))
    ]
    failed = [line for line in lines if 'FAILED' in line]
    if done.returncode or failed or not any(line.startswith('loop ') for line in found):
        first = f': {failed[0]}' if failed else ''
        raise RuntimeError(f'exit {done.returncode}{first}; see {call.out / "fused_kernels.txt"}')
    call.record('fused_kernels', {f'line {i + 1}': line for i, line in enumerate(found)})


def ckpt_io(call: Call) -> None:
    """Checkpoint I/O in both formats beside PyTorch's and the disk's (bench/ckpt_io.py): LLaMA-3.2
    1B's shape on a GPU, the tiny GPT-2 on a CPU."""
    sys.path.insert(0, str(REPO / 'bench'))
    import ckpt_io as figure

    name = 'tiny' if call.device == 'cpu' else 'llama3.2-1b'
    shape = figure.shape_of(name)
    shard = SHARD
    if name == 'llama3.2-1b':
        _write_shard(LLAMA_SHARD, 128256, 'llama3')
        shard = LLAMA_SHARD
    flags = _loop_flags(shape['config'], shape['batch'], shape['sequence'])
    env = {**os.environ, 'PYTHONPATH': _python_path()}
    figure.measure(call, name, flags, shard, env, PEER_PYTHON)


# name -> (function, what it needs, what it measures)
FIGURES = {
    'loop': (loop, 'gpu', 'the real training loop, fast mode: step lines, wall clock, MFU'),
    'deterministic': (
        deterministic,
        'gpu',
        'the loop in deterministic mode, twice: ratio to fast, bitwise equal?',
    ),
    'saves': (saves, 'gpu', 'the loop saving every 20 steps into /dev/shm, keeping 2: ratio to no saves'),
    'peers': (peers, 'gpu', 'llm.c + cuDNN, PyTorch compile, plain JAX step; the loop against llm.c'),
    'profile': (profile, 'gpu', "the fast step's device time per kernel (jaxtrain.bench --profile_steps)"),
    'save_trace': (
        save_trace,
        'gpu',
        'the saves loop traced over steps 40-43 (a save and the steps after it): kernels, trace files',
    ),
    'seed': (seed, 'gpu', 'bit-exact resume, deterministic: 100 steps saving every 20, resumed from 40'),
    'llama': (llama, 'gpu', "LLaMA-3.2 1B's real loop, B4 x T2048: step lines, wall clock, MFU"),
    'llama_peer': (llama_peer, 'gpu', "llm.c's PyTorch LLaMA-3 on the same shape; the loop against it"),
    'llama_profile': (
        llama_profile,
        'gpu',
        "LLaMA-3.2 1B's step: device time per kernel, MFU (jaxtrain.bench --profile_steps)",
    ),
    'lora': (lora, 'gpu', 'full fine-tuning against LoRA r=8: step time and checkpoint size'),
    'two_gpus': (two_gpus, '2 gpus', 'data parallel on 2 GPUs against 1'),
    'pipeline': (pipeline, 'cpu', 'pipeline stages on fake CPU devices: memory per device and the bubble'),
    'recompute': (recompute, 'any', 'activation recompute plans: peak memory of the step and its time'),
    'fused_kernels': (
        fused_kernels,
        'gpu',
        '--fused_kernels against XLA: each kernel alone, then the loop with and without them',
    ),
    'ckpt_io': (
        ckpt_io,
        'any',
        'checkpoint save, restore, start-up and RSS in both formats beside torch.save, DCP and dd',
    ),
    'decode': (decode, 'gpu', 'KV-cache decoding, GPT-2 124M bf16, 256 new tokens: tok/s at batch 1 and 16'),
    'decode_variants': (
        decode_variants,
        'gpu',
        "the decoder's levers (unrolled layers, positions per step, CUDA graphs of loops): tok/s each",
    ),
}


def _gpus() -> int:
    try:
        out = subprocess.run(['nvidia-smi', '-L'], capture_output=True, text=True, check=False).stdout
    except OSError:
        return 0
    return sum(line.startswith('GPU ') for line in out.splitlines())


def _write_shard(path: Path = SHARD, vocab: int = 50257, kind: str = 'gpt2'):
    """A shard of 4M random ids below vocab (llm.c's format): GPT-2's, which every GPT-2 loop reads
    as the peers' data, or LLaMA-3's (uint32) for the llama figures."""
    if path.exists():
        return
    import numpy as np

    import llmc_io

    path.parent.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if kind == 'gpt2' else np.uint32
    llmc_io.write_shard(path, np.random.default_rng(0).integers(0, vocab, 4_000_000, dtype=dtype), kind)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('out', nargs='?', help='folder for the logs, metrics and figures.jsonl')
    parser.add_argument(
        '--figures', default='', help=f"comma-separated, of: {', '.join(FIGURES)} (default: all)"
    )
    parser.add_argument(
        '--steps', type=int, default=110, help='steps of each loop run (figures from step 11 on)'
    )
    parser.add_argument('--list', action='store_true', help='list the figures and exit')
    args = parser.parse_args(argv)
    if args.list:
        for name, (_, needs, what) in FIGURES.items():
            print(f'{name:14s} {needs:7s} {what}')
        return 0
    if not args.out:
        parser.error('expected OUT_DIR (or --list)')
    chosen = [f for f in args.figures.split(',') if f] or list(FIGURES)
    unknown = [f for f in chosen if f not in FIGURES]
    if unknown:
        parser.error(f"--figures: expected names among {', '.join(FIGURES)}; found {', '.join(unknown)}")
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    gpus = _gpus()
    device = (
        subprocess.run(
            ['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
            capture_output=True,
            text=True,
            check=False,
        )
        .stdout.strip()
        .splitlines()
        if gpus
        else ['cpu']
    )
    call = Call(out, args.steps, device[0])
    call.record('call', {'date': datetime.date.today().isoformat(), 'device': f'{gpus or 1} x {device[0]}'})
    os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', '/tmp/jaxtrain_xla_cache')
    if 'peers' in chosen and PEERS.is_dir():
        call.build = subprocess.Popen(
            ['bash', str(PEERS / 'run_peers.sh'), 'build', str(out / 'peers')],
            stdout=open(out / 'peers_build.txt', 'w'),
            stderr=subprocess.STDOUT,
        )
    _write_shard()
    failed = 0
    for name in chosen:
        function, needs, _ = FIGURES[name]
        if (needs == 'gpu' and gpus < 1) or (needs == '2 gpus' and gpus < 2):
            print(f'{name}: skipped (needs {needs}; this machine has {gpus})', flush=True)
            continue
        began = time.perf_counter()
        try:
            function(call)
        except (RuntimeError, OSError, KeyError, ValueError) as e:
            failed += 1
            print(f'{name}: failed: {e}', flush=True)
        print(f'  ({time.perf_counter() - began:.0f} s)', flush=True)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
