"""The ckpt_io figure of bench/figures.py: checkpoint I/O of the real loop at one model shape, in
both formats, beside PyTorch's checkpoints of the same tensors and the disk's own rate, in one call.

For each format (orbax, infinitrain) the real loop (python -m jaxtrain.main, AdamW, the optimizer
state saved) runs N steps saving at step S = 5N/6 and at N; then a second run
resumes the step-N directory, its files dropped from the page cache first so that it reads the
disk. Beside them: a run without saves (twice: the first fills the compilation cache, so that
every start-up compared is a cached one), PyTorch's torch.save / torch.load and DCP save / load
of the same fp32 tensors on the same device (bench/peers/torch_checkpoint.py), and dd's
direct-I/O write and read rates of the same disk. What is reported, per format:
  step_GiB             the step directory's size
  blocked_ms           the loop held by the save at step S (metrics save_blocked_s)
  commit_s, GB/s       from the save's start to its step directory appearing under its name
  after_save           the two steps after S over the median step before it
  startup_s            process start to step 1's record, less the same of the run without saves
  first_step_s         process start to the resumed run's first step record; restore_s its restore
  peak_rss_GiB         of the saving run and of the resumed run (the process's high-water mark)
The checkpoints go to CKPT_IO_DIR (default .ckpt_io/ in the repository, on the disk measured) and
are deleted after each format: at most two steps are on the disk at a time. CKPT_IO_FORMATS (a
comma-separated list, default orbax,infinitrain) measures fewer formats where a call has little time;
CKPT_IO_TOOLS=1 also times `ckpt export` of each resumed step into the other format and `ckpt diff`
of the two, both from a cold cache.
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

# name -> (config, batch, sequence); llama3.2-1b is the figure's, tiny lets a test run it on a CPU.
SHAPES = {
    'llama3.2-1b': ('configs/llama3.py:llama3.2-1b', 4, 2048, 60, 8 << 30),
    'tiny': ('configs/gpt2.py:tiny', 2, 64, 12, 64 << 20),
}
FORMATS = tuple(os.environ.get('CKPT_IO_FORMATS', 'orbax,infinitrain').split(','))
TOOLS = os.environ.get('CKPT_IO_TOOLS') == '1'  # also time `ckpt export` and `ckpt diff` of each step
GiB = 2**30


def tool_times(out: Path, env: dict, step_dir: Path, fmt: str, exported: Path, read_rate) -> dict:
    """`ckpt export` of the step into another format (Orbax's into InfiniTrain's, InfiniTrain's into
    its PR generation: `ckpt export` writes no Orbax), then `ckpt diff` of the two (both cold):
    seconds, and the rate over the bytes each reads."""
    other = 'infinitrain' if fmt == 'orbax' else 'infinitrain-bin'
    values, nbytes = {}, size_of(step_dir)
    drop_from_page_cache(step_dir)
    for name, args in (
        (f'export to {other}', ['export', str(step_dir), '--format', other, '--output', str(exported)]),
        ('diff with the export', ['diff', str(step_dir), str(exported)]),
    ):
        began = time.perf_counter()
        command = [sys.executable, '-m', 'jaxtrain.ckpt', *args]
        code, _, rss, _ = run_measured(out, f'ckpt_io_{fmt}_{args[0]}', command, env, timeout=600)
        seconds = time.perf_counter() - began
        read = nbytes * (2 if args[0] == 'diff' else 1)
        values[f'{name}_s'] = round(seconds, 2) if code in (0, 1) else f'exit {code}'
        values[f'{name} GB/s read'] = round(read / 1e9 / seconds, 3)
        values[f'{name} vs dd read'] = _ratio(read / 1e9 / seconds, read_rate)
        values[f'{name} peak_rss_GiB'] = round(rss / GiB, 2)
        if exported.exists():
            drop_from_page_cache(exported)
        drop_from_page_cache(step_dir)
    shutil.rmtree(exported.parent, ignore_errors=True)
    return values


def shape_of(name: str) -> dict:
    config, batch, sequence, steps, dd_bytes = SHAPES[name]
    return {'config': config, 'batch': batch, 'sequence': sequence, 'steps': steps, 'dd_bytes': dd_bytes}


def parameter_shapes(config: str) -> dict:
    """{name: dims} of the model's parameters, each layer's apart, as a PyTorch model holds them."""
    from jaxtrain.checkpoint.formats.infinitrain.trainer import model_header
    from jaxtrain.models import FAMILIES

    family, variant = Path(config.split(':')[0]).stem, config.split(':')[1]
    header = model_header(family, FAMILIES[family][2][variant])
    shapes = {}
    for path, dims in header.param_shapes().items():
        if path.startswith('h/'):
            shapes.update({f'{path}/{i}': list(dims[1:]) for i in range(dims[0])})
        else:
            shapes[path] = list(dims)
    return shapes


def run_measured(out: Path, name: str, command: list, env: dict, timeout: int, watch=()):
    """(exit code, the epoch time it started, its peak RSS in bytes, {path: epoch time it appeared}
    for the paths in `watch`, looked for every 50 ms), its output into OUT/name.txt."""
    log = out / f'{name}.txt'
    seen = {}
    with open(log, 'w') as f:
        f.write(' '.join(command) + '\n')
        f.flush()
        started = time.time()
        child = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while True:
            seen.update({path: time.time() for path in watch if path not in seen and path.exists()})
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                child.returncode = os.waitstatus_to_exitcode(status)
                return child.returncode, started, usage.ru_maxrss * 1024, seen
            if time.monotonic() > deadline:
                child.kill()
                _, status, usage = os.wait4(child.pid, 0)
                f.write(f'\ntimed out after {timeout} s\n')
                return 124, started, usage.ru_maxrss * 1024, seen
            time.sleep(0.05)


def drop_from_page_cache(path: Path) -> None:
    """posix_fadvise DONTNEED on every file under path: the next read comes from the disk."""
    for file in [path] if path.is_file() else path.rglob('*'):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob('*') if f.is_file())


def dd_rate(text: str) -> float | None:
    """GB/s from dd's last line '<bytes> bytes (...) copied, <seconds> s, <rate>'."""
    found = re.findall(r'^(\d+) bytes .* copied, ([\d.]+) s', text, re.M)
    if not found:
        return None
    nbytes, seconds = found[-1]
    return round(int(nbytes) / float(seconds) / 1e9, 3)


def disk_rates(out: Path, work: Path, nbytes: int) -> dict:
    """dd's write (fsync included) and read rates, with direct I/O where the file system has it."""
    path = work / 'dd.bin'
    block = min(nbytes, 64 << 20)
    values = {}
    for direct in (True, False):
        write = ['dd', 'if=/dev/zero', f'of={path}', f'bs={block}', f'count={nbytes // block}', 'conv=fsync']
        read = ['dd', f'if={path}', 'of=/dev/null', f'bs={block}']
        if direct:
            write.append('oflag=direct')
            read.append('iflag=direct')
        wrote = subprocess.run(write, capture_output=True, text=True, check=False)
        drop_from_page_cache(path) if path.exists() else None
        got = subprocess.run(read, capture_output=True, text=True, check=False)
        path.unlink(missing_ok=True)
        if wrote.returncode == 0 and got.returncode == 0:
            values = {
                'write GB/s': dd_rate(wrote.stderr),
                'read GB/s': dd_rate(got.stderr),
                'direct I/O': direct,
            }
            break
    (out / 'ckpt_io_dd.txt').write_text(f'{values}\n')
    return values


def torch_peers(out: Path, work: Path, config: str, device: str, python: str, env: dict) -> dict:
    shapes = out / 'ckpt_io_shapes.json'
    shapes.write_text(json.dumps(parameter_shapes(config)))
    script = Path(__file__).resolve().parent / 'peers' / 'torch_checkpoint.py'
    command = [python, str(script), str(shapes), str(work / 'torch'), '--device', device]
    code, *_ = run_measured(out, 'ckpt_io_torch', command, env, timeout=900)
    rows = [json.loads(x) for x in (out / 'ckpt_io_torch.txt').read_text().splitlines() if x.startswith('{')]
    shutil.rmtree(work / 'torch', ignore_errors=True)
    if not rows:
        return {'skipped': f'exit {code}; see ckpt_io_torch.txt'}
    found = {}
    for row in rows:
        gb = row['bytes'] / 1e9
        found[row['peer']] = {
            'save_s': round(row['save_s'], 2),
            'save GB/s': round(gb / row['save_s'], 3),
            'load_s': round(row['load_s'], 2),
            'load GB/s': round(gb / row['load_s'], 3),
            'GiB': round(row['bytes'] / GiB, 2),
            'peak_rss_GiB': round(row['peak_rss_bytes'] / GiB, 2),
        }
    return found


def _rows(metrics_dir: Path) -> list:
    path = metrics_dir / 'metrics.jsonl'
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def first_step_s(rows: list, started: float) -> float | None:
    steps = [r for r in rows if 'loss' in r]
    return None if not steps else round(min(steps, key=lambda r: r['step'])['time'] - started, 2)


def last_write_time(step_dir: Path) -> float | None:
    """The newest modification time of the files of a committed step: when its write ended."""
    times = [f.stat().st_mtime for f in step_dir.rglob('*') if f.is_file()]
    return max(times) if times else None


def rows_began(rows: list, save_step: int) -> float | None:
    """The epoch time the save at save_step began, from its metrics row."""
    saved = [r for r in rows if r.get('step') == save_step and 'save_blocked_s' in r]
    return saved[0]['time'] - saved[0]['save_blocked_s'] if saved else None


def save_figures(rows: list, save_step: int, nbytes: int, written_at: float | None) -> dict:
    """The save at save_step: what it held the loop, when it was committed (written_at: when its
    step directory appeared under its final name, which the loop's own commit line sees only at
    its next look), the two steps after it and those during the write."""
    steps = {r['step']: r for r in rows if 'loss' in r}
    before = [steps[s]['step_ms'] for s in steps if 2 <= s < save_step]  # step 1 compiles
    median = statistics.median(before) if before else None
    saved = [r for r in rows if r.get('step') == save_step and 'save_blocked_s' in r]
    began = rows_began(rows, save_step)
    write_s = written_at - began if written_at is not None and began is not None else None
    after = [steps[s]['step_ms'] for s in (save_step + 1, save_step + 2) if s in steps]
    during = [
        steps[s]['step_ms'] for s in steps if s > save_step and write_s and steps[s]['time'] <= written_at
    ]
    return {
        'median_step_ms': None if median is None else round(median, 2),
        'blocked_ms': round(1e3 * saved[0]['save_blocked_s'], 2) if saved else None,
        'commit_s': None if write_s is None else round(write_s, 2),
        'commit GB/s': None if not write_s else round(nbytes / 1e9 / write_s, 3),
        'after_save_ms': [round(ms, 1) for ms in after],
        'after_save_vs_median': round(max(after) / median, 3) if after and median else None,
        'steps during the write': len(during),
        'their median_ms': round(statistics.median(during), 2) if during else None,
    }


def _ratio(a, b, digits=3):
    return None if a is None or b in (None, 0) else round(a / b, digits)


def measure(
    call, name: str, model_flags: list, shard: Path, env: dict, peer_python: str, formats=FORMATS
) -> None:
    """Runs the figure at SHAPES[name] (model_flags: python -m jaxtrain.main's flags for it; env: the
    children's environment; peer_python: the interpreter with torch) and records ckpt_io_disk,
    ckpt_io_torch, ckpt_io_no_saves and one ckpt_io_<format> per format."""
    shape = shape_of(name)
    steps, save_step = shape['steps'], shape['steps'] * 5 // 6
    out = call.out
    work = Path(os.environ.get('CKPT_IO_DIR', Path(__file__).resolve().parents[1] / '.ckpt_io')).absolute()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    gpu = call.device != 'cpu'
    disk = disk_rates(out, work, shape['dd_bytes'])
    call.record('ckpt_io_disk', {'folder': str(work), **disk})
    peers = torch_peers(out, work, shape['config'], 'cuda' if gpu else 'cpu', peer_python, env)
    call.record('ckpt_io_torch', peers)

    def loop(run: str, extra: list, num_steps: int, watch=()):
        metrics = out / run
        command = [sys.executable, '-m', 'jaxtrain.main', *model_flags, '--input_bin', str(shard)]
        command += ['--num_iteration', str(num_steps), '--metrics_dir', str(metrics), *extra]
        code, started, rss, seen = run_measured(out, run, command, env, timeout=600, watch=watch)
        if code:
            raise RuntimeError(f'{run}: exit {code}; see {out / run}.txt')
        rows = _rows(metrics)
        return rows, first_step_s(rows, started), rss, seen

    loop('ckpt_io_no_saves_compile', [], 2)  # fills the compilation cache
    base_rows, base_first, base_rss, _ = loop('ckpt_io_no_saves', [], steps)
    base_median = statistics.median([r['step_ms'] for r in base_rows if 'loss' in r and r['step'] >= 2])
    call.record(
        'ckpt_io_no_saves',
        {
            'first_step_s': base_first,
            'median_step_ms': round(base_median, 2),
            'peak_rss_GiB': round(base_rss / GiB, 2),
        },
    )
    dcp = peers.get('torch DCP', {}) if isinstance(peers.get('torch DCP'), dict) else {}
    for fmt in formats:
        root = work / fmt
        saving = ['--checkpoint_dir', str(root), '--checkpoint_format', fmt, '--save_steps', str(save_step)]
        saving += ['--max_checkpoint_keep', '2', '--save_optimizer_state', 'true']
        first_save = root / f'checkpoint_step_{save_step:06d}'
        rows, first, rss, seen = loop(f'ckpt_io_{fmt}_save', saving, steps, watch=[first_save])
        nbytes = size_of(first_save)
        values = {
            'step_GiB': round(nbytes / GiB, 2),
            **save_figures(rows, save_step, nbytes, seen.get(first_save)),
        }
        written = last_write_time(first_save)  # its files' newest mtime: a lower bound of the commit
        values['last file written_s'] = (
            None if written is None else round(written - rows_began(rows, save_step), 2)
        )
        shutil.rmtree(first_save)
        step_dir = root / f'checkpoint_step_{steps:06d}'
        values['commit vs dd write'] = _ratio(values['commit GB/s'], disk.get('write GB/s'))
        values['startup_s'] = None if first is None or base_first is None else round(first - base_first, 2)
        values['save run peak_rss_GiB'] = round(rss / GiB, 2)
        drop_from_page_cache(step_dir)
        began = time.perf_counter()
        verify = [sys.executable, '-m', 'jaxtrain.ckpt', 'verify', str(step_dir)]
        code, *_ = run_measured(out, f'ckpt_io_{fmt}_verify', verify, env, timeout=600)
        values['verify_s'] = round(time.perf_counter() - began, 2) if code == 0 else f'exit {code}'
        drop_from_page_cache(step_dir)
        rows, first, rss, _ = loop(f'ckpt_io_{fmt}_resume', ['--resume_from', str(step_dir)], steps + 2)
        restore = [r['restore_s'] for r in rows if 'restore_s' in r]
        values['restore_s'] = round(restore[0], 2) if restore else None
        values['resumed first_step_s'] = first
        read = disk.get('read GB/s')
        if read and base_first is not None:
            values['target_s'] = round(nbytes / 1e9 / read + base_first + 3, 2)
        if dcp.get('load_s') is not None and base_first is not None:
            values['DCP load + start_s'] = round(dcp['load_s'] + base_first, 2)
        values['resume run peak_rss_GiB'] = round(rss / GiB, 2)
        values['rss bound_GiB'] = round(nbytes / GiB + 2, 2)
        if TOOLS:
            values.update(tool_times(out, env, step_dir, fmt, work / 'exported' / step_dir.name, read))
        shutil.rmtree(root, ignore_errors=True)
        call.record(f'ckpt_io_{fmt}', values)
    shutil.rmtree(work, ignore_errors=True)
