"""Taps for the precision checker (`--precision_check`, jaxtrain/models/precision_check.py):
`tap(name, x)` is the identity, and while a checker is active at trace time it hands the
forward value of x, and in the backward pass the gradient arriving at x, to the checker on
the host through jax.debug.callback, so it works inside the jitted, scanned train step.

With no checker (the default) a tap adds nothing to the traced program.
"""

import contextlib
from functools import partial

import jax

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
