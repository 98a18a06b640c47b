"""InfiniTrain's learning-rate schedulers (PR 151), step for step and bit for bit in float32.

Upstream: InfiniTensor/InfiniTrain a7949ac0f46fb3de64520a18bc13ebc70b6bc158 (branch feat/lr_scheduler),
infini_train/src/lr_scheduler.cc (CreateLRScheduler, LambdaLR, LinearLR, SequentialLR) and
example/gpt2/main.cc (the five flags; Step() after each optimizer step; the step line prints the lr the
optimizer used). Every value there is a C++ `float`, and LinearLR is *chained*: each step multiplies the
previous lr by a factor, so its rounding errors accumulate. optax's schedules compute in another order
(and jnp's cos is not glibc's cosf), so only the constant style maps onto optax exactly; the others are
replayed here with NumPy float32 scalars, one IEEE operation per C++ operation, and handed to optax as
a table (optimizer.py). The binary links glibc's cosf; this module calls the same function through ctypes
where the C library has it.

The replay is also the state upstream saves: `state()` is LRScheduler::State() / SequentialLR::State()
(last_step, recover_lr = the optimizer's current lr, base_lr; plus scheduler_<i>.* for a warmup),
`load_state()` is LoadState(), which is how a resumed run continues exactly where the file says.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import math

import numpy as np

STYLES = ('none', 'constant', 'linear', 'cosine', 'inverse-square-root')
f32 = np.float32


def _load_cosf():
    name = ctypes.util.find_library('m')
    try:
        cosf = ctypes.CDLL(name).cosf if name else None
    except (OSError, AttributeError):
        cosf = None
    if cosf is None:
        return lambda x: f32(math.cos(float(x)))  # correctly rounded; glibc's cosf errs by <= 0.56 ulp
    cosf.restype, cosf.argtypes = ctypes.c_float, [ctypes.c_float]
    return lambda x: f32(cosf(float(x)))


_cosf = _load_cosf()
_PI_F = f32(math.pi)  # std::numbers::pi_v<float>


class ScheduleError(ValueError):
    """A schedule upstream's CreateLRScheduler refuses; the message is one line."""


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    """TrainingLRSchedulerConfig (lr_scheduler.h) with main.cc's lr_decay_iters default applied."""

    style: str  # none | constant | linear | cosine | inverse-square-root
    lr: float  # --learning_rate, the peak (max_lr)
    min_lr: float = 0.0
    warmup_iters: int = 0
    warmup_init: float = 0.0
    decay_iters: int = 1  # --lr_decay_iters, or --num_iteration when that is 0

    def check(self) -> None:
        """CreateLRScheduler's CHECKs (and main.cc's style validator), as one-line errors."""
        if self.style not in STYLES:
            raise ScheduleError(f"lr_decay_style: expected one of {' | '.join(STYLES)}, found {self.style!r}")
        if self.style == 'none':
            return
        max_lr, min_lr, init = f32(self.lr), f32(self.min_lr), f32(self.warmup_init)
        rules = (
            (max_lr > 0, 'learning_rate', '> 0 with a decay style', self.lr),
            (init >= 0, 'lr_warmup_init', '>= 0', self.warmup_init),
            (min_lr >= 0, 'min_lr', '>= 0', self.min_lr),
            (max_lr >= min_lr, 'min_lr', f'<= learning_rate {self.lr}', self.min_lr),
            (init <= max_lr, 'lr_warmup_init', f'<= learning_rate {self.lr}', self.warmup_init),
            (self.warmup_iters >= 0, 'lr_warmup_iters', '>= 0', self.warmup_iters),
            (self.decay_iters > 0, 'lr_decay_iters', '> 0 (0 takes num_iteration)', self.decay_iters),
            (
                self.warmup_iters < self.decay_iters,
                'lr_warmup_iters',
                f'< lr_decay_iters {self.decay_iters} (0 = num_iteration)',
                self.warmup_iters,
            ),
        )
        for ok, key, expected, found in rules:
            if not ok:
                raise ScheduleError(f'{key}: expected {expected}, found {found}')


class _Optimizer:
    """What the schedulers share: the optimizer's float learning rate (optimizer.cc)."""

    def __init__(self, lr):
        self.lr = f32(lr)


class _Scheduler:
    """LRScheduler: last_step starts at -1; Create() runs InitialStep(), i.e. one Step()."""

    def __init__(self, optimizer: _Optimizer, base_lr):
        self.optimizer = optimizer
        self.last_step = -1
        self.base_lr = f32(base_lr)
        self.is_initial = False

    def initial_step(self) -> None:
        self.is_initial = True
        self.step()
        self.is_initial = False

    def step(self) -> None:
        self.last_step += 1
        self.optimizer.lr = self.chained_lr()

    def step_to(self, epoch: int) -> None:
        self.last_step = epoch
        self.optimizer.lr = self.closed_form_lr()

    def chained_lr(self):
        return self.closed_form_lr()

    def closed_form_lr(self):
        raise NotImplementedError

    def state(self) -> dict:
        # The insertion order of LRScheduler::State()'s initializer list (the file's order comes from it).
        return {
            'last_step': int(self.last_step),
            'recover_lr': f32(self.optimizer.lr),
            'base_lr': self.base_lr,
        }

    def load_state(self, state: dict) -> None:
        self.last_step = int(state['last_step'])
        self.base_lr = f32(state['base_lr'])
        self.optimizer.lr = f32(state['recover_lr'])


class _LambdaLR(_Scheduler):
    def __init__(self, optimizer, base_lr, factor):
        super().__init__(optimizer, base_lr)
        self.factor = factor

    def closed_form_lr(self):
        return f32(self.base_lr * self.factor(self.last_step))


class _LinearLR(_Scheduler):
    def __init__(self, optimizer, base_lr, start_factor, end_factor, total_iters: int):
        super().__init__(optimizer, base_lr)
        self.start, self.end, self.total = f32(start_factor), f32(end_factor), int(total_iters)

    def closed_form_lr(self):
        if self.last_step >= self.total:
            return f32(self.base_lr * self.end)
        # base_lr * (start + (end - start) * float(last_step) / float(total)), left to right
        scaled = f32(f32(f32(self.end - self.start) * f32(self.last_step)) / f32(self.total))
        return f32(self.base_lr * f32(self.start + scaled))

    def chained_lr(self):
        lr = self.optimizer.lr
        if self.last_step == 0:
            return f32(lr * self.start)
        if self.last_step > self.total or self.is_initial:
            return lr
        if self.last_step == self.total:
            previous = f32(
                self.start + f32(f32(self.end - self.start) * f32(self.total - 1)) / f32(self.total)
            )
            return f32(lr * f32(self.end / previous))
        numerator = f32(self.end - self.start)
        denominator = f32(f32(self.start * f32(self.total)) + f32(f32(self.last_step - 1) * numerator))
        return f32(lr * f32(f32(1) + f32(numerator / denominator)))


class _SequentialLR(_Scheduler):
    def __init__(self, optimizer, base_lr, schedulers: list, milestones: list[int]):
        super().__init__(optimizer, base_lr)
        self.schedulers, self.milestones = schedulers, milestones

    def initial_step(self) -> None:
        self.optimizer.lr = self.schedulers[0].base_lr
        for child in self.schedulers:  # UndoChildInitialSteps
            child.last_step -= 1
        self.last_step += 1
        self.schedulers[0].initial_step()

    def step(self) -> None:
        self.last_step += 1
        index = sum(1 for m in self.milestones if m <= self.last_step)  # std::upper_bound
        child = self.schedulers[index]
        if index > 0 and self.milestones[index - 1] == self.last_step:
            child.step_to(0)
        else:
            child.step()

    def state(self) -> dict:
        state = super().state()
        for i, child in enumerate(self.schedulers):
            state.update({f'scheduler_{i}.{key}': value for key, value in child.state().items()})
        return state

    def load_state(self, state: dict) -> None:
        for i, child in enumerate(self.schedulers):
            prefix = f'scheduler_{i}.'
            sub = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            if sub:
                child.load_state(sub)
        super().load_state(state)


def create(spec: ScheduleSpec):
    """CreateLRScheduler: the scheduler after construction (its InitialStep done), or None for 'none'.
    The optimizer's lr then is the lr of the first step."""
    spec.check()
    if spec.style == 'none':
        return None
    optimizer = _Optimizer(spec.lr)
    max_lr, min_lr = f32(spec.lr), f32(spec.min_lr)
    base = max_lr  # LRScheduler's ctor: the optimizer's initial learning rate
    after_warmup = spec.decay_iters - spec.warmup_iters
    if spec.style == 'constant':
        main = _LambdaLR(optimizer, base, lambda step: f32(1))
    elif spec.style == 'linear':
        main = _LinearLR(optimizer, base, 1.0, f32(min_lr / max_lr), after_warmup)
    elif spec.style == 'cosine':

        def cosine(step):
            if step > after_warmup:
                return f32(min_lr / max_lr)
            ratio = f32(f32(step) / f32(after_warmup))
            coeff = f32(f32(0.5) * f32(_cosf(f32(_PI_F * ratio)) + f32(1)))
            return f32(f32(min_lr + f32(coeff * f32(max_lr - min_lr))) / max_lr)

        main = _LambdaLR(optimizer, base, cosine)
    else:  # inverse-square-root

        def inverse_square_root(step):
            global_step = step + spec.warmup_iters
            if global_step > spec.decay_iters:
                return f32(min_lr / max_lr)
            warmup = f32(max(spec.warmup_iters, 1))
            current = f32(max(global_step, 1))
            scaled = f32(f32(max_lr * np.sqrt(warmup)) / np.sqrt(current))
            return f32(max(min_lr, scaled) / max_lr)

        main = _LambdaLR(optimizer, base, inverse_square_root)
    main.initial_step()
    if spec.warmup_iters == 0:
        return main
    init, warmup_iters = f32(spec.warmup_init), spec.warmup_iters

    def warmup(step):
        ratio = f32(f32(step) / f32(warmup_iters))
        return f32(f32(init + f32(f32(max_lr - init) * ratio)) / max_lr)

    warm = _LambdaLR(optimizer, base, warmup)
    warm.initial_step()
    sequential = _SequentialLR(optimizer, base, [warm, main], [warmup_iters])
    sequential.initial_step()
    return sequential


class Replay:
    """One scheduler stepped forward on demand, for a run's saves: a save every N steps replays N steps,
    not the whole run (a step costs some 20 us of NumPy scalars). saved_state: an lr_scheduler.ckpt's
    entries at step saved_step, loaded when the replay gets there, as upstream's LoadState on resume."""

    def __init__(self, spec: ScheduleSpec, saved_state: dict | None = None, saved_step: int = 0):
        self.spec, self.saved_state, self.saved_step = spec, saved_state, saved_step
        self._restart()

    def _restart(self) -> None:
        self.scheduler, self.step = create(self.spec), 0
        self._load_if_due()

    def _load_if_due(self) -> None:
        if self.scheduler is not None and self.saved_state is not None and self.step == self.saved_step:
            self.scheduler.load_state(self.saved_state)

    def advance_to(self, step: int) -> None:
        if step < self.step:
            self._restart()
        while self.step < step:
            if self.scheduler is not None:
                self.scheduler.step()
            self.step += 1
            self._load_if_due()

    def lr_at(self, step: int) -> np.float32:
        """The lr of optimizer update step + 1 (the step line's `step step+1`)."""
        self.advance_to(step)
        return f32(self.spec.lr) if self.scheduler is None else self.scheduler.optimizer.lr

    def state_at(self, step: int) -> dict | None:
        """State() after `step` updates (what a save at that step writes); None for style 'none'."""
        self.advance_to(step)
        return None if self.scheduler is None else self.scheduler.state()


def learning_rates(spec: ScheduleSpec, steps: int, saved_state: dict | None = None, saved_step: int = 0):
    """float32 array: element k is the lr of optimizer update k + 1 (the step line's `step k+1`), for
    k < steps, continuing from saved_state at saved_step if given (see Replay)."""
    replay = Replay(spec, saved_state, saved_step)
    return np.array([replay.lr_at(k) for k in range(steps)], np.float32)


def state_at(
    spec: ScheduleSpec, step: int, saved_state: dict | None = None, saved_step: int = 0
) -> dict | None:
    """The scheduler's State() after `step` optimizer updates (what a save at that step writes), or None
    for style 'none' (no scheduler, no file). saved_state / saved_step: as for Replay."""
    return Replay(spec, saved_state, saved_step).state_at(step)
