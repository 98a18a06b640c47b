"""InfiniTrain's precision checker (`--precision_check "level=1,path=...,format=simple|md5,
save_tensors=true,md5_tolerance=x"`, docs/precision_checker_guide.md and
infini_train/src/utils/precision_checker.cc at b24d92f), under jit.

Level 1 covers the forward output and the backward gradient of every module the models tap
(`tap`, below): each block's CausalSelfAttention, MLP and Block. The
values reach the host through jax.debug.callback from inside the compiled step; nothing is
re-run eagerly. Output, as upstream's:
  PATH/YYYYMMDD_HHMMSS/precision_check_rank_R.log   one line per tensor
  PATH/YYYYMMDD_HHMMSS/rank_R/NAME[_IDX]_STAGE.npy   with save_tensors (overwritten each step)
simple: `[GAS-g] [L-l] Block_1_forward tensor[0]: dtype=float32 shape=(4,64,32) min=... max=...
mean=... [first 6 values, ...] [NaN:0 Inf:0]`, ` <- ERROR` on a non-finite value; md5: the
md5 of the bytes (of the values rounded to md5_tolerance when it is > 0). IDX counts a
name's calls within the step (upstream's counter), g the micro-step and l the layer. Ours
beside theirs: a `[STEP n]` line opens each step, so that `python -m jaxtrain.compare_precision
A B` can name the first step and module at which two runs differ.

The taps: `tap(name, x)` is the identity, and while a checker is active at trace time it hands the
forward value of x, and in the backward pass the gradient arriving at x, to the checker on
the host through jax.debug.callback, so it works inside the jitted, scanned train step.

With no checker (the default) a tap adds nothing to the traced program.
"""

import contextlib
import dataclasses
import datetime
import hashlib
from functools import partial
from pathlib import Path

import jax
import numpy as np

FORMATS = ('simple', 'md5')


@dataclasses.dataclass(frozen=True)
class PrecisionCheckConfig:
    level: int = 0  # 0 off, 1 modules (upstream's 2, functions, is not built)
    path: str = './log_precision_check'
    format: str = 'simple'
    save_tensors: bool = False
    md5_tolerance: float = 0.0


def parse(text: str) -> PrecisionCheckConfig:
    """'level=1,format=md5,...' -> the config; one-line ValueError naming the bad part."""
    fields = {}
    for part in filter(None, (p.strip() for p in text.split(','))):
        key, sep, value = part.partition('=')
        if not sep:
            raise ValueError(f'--precision_check: expected key=value, found {part!r}')
        fields[key.strip()] = value.strip()
    known = {f.name for f in dataclasses.fields(PrecisionCheckConfig)}
    if set(fields) - known:
        unknown = sorted(set(fields) - known)[0]
        raise ValueError(f"--precision_check: expected one of {', '.join(sorted(known))}, found {unknown!r}")
    try:
        config = PrecisionCheckConfig(
            level=int(fields.get('level', 0)),
            path=fields.get('path', PrecisionCheckConfig.path),
            format=fields.get('format', 'simple'),
            save_tensors=fields.get('save_tensors', 'false').lower() in ('true', '1', 'yes', 'on'),
            md5_tolerance=float(fields.get('md5_tolerance', 0.0)),
        )
    except ValueError as e:
        raise ValueError(f'--precision_check: {text!r}: {e}') from None
    if config.level not in (0, 1):
        raise ValueError(f'--precision_check: level: expected 0 or 1 (module level), found {config.level}')
    if config.format not in FORMATS:
        raise ValueError(f'--precision_check: format: expected simple or md5, found {config.format!r}')
    return config


def _g(value) -> str:
    """A float as C++'s default ostream prints it."""
    return f'{float(value):g}'


def _dtype_name(array) -> str:
    return 'bfloat16' if array.dtype.name == 'bfloat16' else array.dtype.name


def tensor_line(context: str, log_name: str, array, config: PrecisionCheckConfig) -> str:
    shape = ','.join(map(str, array.shape))
    head = f'{context} {log_name} tensor[0]: dtype={_dtype_name(array)} shape=({shape})'
    values = np.asarray(array, np.float32).ravel()
    if config.format == 'md5':
        data = np.asarray(array)  # the raw bytes, as upstream hashes them
        if config.md5_tolerance > 0:
            data = (np.round(values / config.md5_tolerance) * config.md5_tolerance).astype(np.float32)
        return f'{head} md5={hashlib.md5(np.ascontiguousarray(data).tobytes()).hexdigest()}'
    nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
    finite = values[np.isfinite(values)]
    biggest = np.finfo(np.float32).max  # what upstream prints when nothing is finite
    low, high = (finite.min(), finite.max()) if finite.size else (biggest, -biggest)
    mean = finite.astype(np.float64).mean() if finite.size else 0.0
    first = ', '.join(_g(v) for v in values[:6]) + (', ...' if values.size > 6 else '')
    error = ' <- ERROR' if nan or inf else ''
    stats = f'min={_g(low)} max={_g(high)} mean={_g(np.float32(mean))}'
    return f'{head} {stats} [{first}] [NaN:{nan} Inf:{inf}]{error}'


class PrecisionChecker:
    """Receives the tapped tensors on the host (from jax.debug.callback) and writes them."""

    def __init__(self, config: PrecisionCheckConfig, num_layers: int, rank: int = 0, now=None):
        self.config = config
        self.num_layers = max(1, num_layers)
        stamp = (now or datetime.datetime.now()).strftime('%Y%m%d_%H%M%S')
        self.root = Path(config.path) / stamp
        self.rank_dir = self.root / f'rank_{rank}'
        self.root.mkdir(parents=True, exist_ok=True)
        if config.save_tensors:
            self.rank_dir.mkdir(exist_ok=True)
        self.log_path = self.root / f'precision_check_rank_{rank}.log'
        self.log = open(self.log_path, 'a')
        self.step = None
        self.counters: dict = {}

    def record(self, name: str, stage: str, value, step):
        step = int(step) + 1  # the step line's 1-based number
        if step != self.step:  # upstream resets its counters every iteration
            self.step, self.counters = step, {}
            self.log.write(f'[STEP {step}]\n')
        idx = self.counters.get((name, stage), 0)
        self.counters[name, stage] = idx + 1
        gas, layer = divmod(idx, self.num_layers)
        if stage == 'backward':
            layer = self.num_layers - 1 - layer  # the backward pass runs the layers in reverse
        array = np.asarray(value)
        if self.config.save_tensors:
            np.save(self.rank_dir / f"{name}{f'_{idx}' if idx else ''}_{stage}.npy", array)
        log_name = f"{name}{f'_{idx}' if idx else ''}_{stage}"
        self.log.write(tensor_line(f'[GAS-{gas}] [L-{layer}]', log_name, array, self.config) + '\n')
        self.log.flush()

    def close(self):
        self.log.close()


_active: list = []  # (checker, step) while the train step is traced with a checker


@contextlib.contextmanager
def checking(checker, step):
    """Taps traced under this report to `checker.record(name, stage, value, step)`."""
    _active.append((checker, step))
    try:
        yield
    finally:
        _active.pop()


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _tapped(checker, name, x, step):
    return x


def _forward(checker, name, x, step):
    jax.debug.callback(partial(checker.record, name, 'forward'), x, step)
    return x, step


def _backward(checker, name, step, grad):
    jax.debug.callback(partial(checker.record, name, 'backward'), grad, step)
    return grad, None


_tapped.defvjp(_forward, _backward)


def tap(name: str, x):
    if not _active or _active[-1][0] is None:
        return x
    checker, step = _active[-1]
    return _tapped(checker, name, x, step)
