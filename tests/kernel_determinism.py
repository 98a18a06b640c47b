"""The determinism check every Pallas kernel's tests make: two runs give the same bits, and no
program the kernel builds contains an atomic add (whose order on a GPU varies from run to run,
so a reduction through one is not bitwise repeatable)."""

import jax
import numpy as np


def assert_repeatable_without_atomics(kernel, inputs, program_names, body_op):
    """kernel(*inputs) -> arrays. program_names: the pallas_call names the jaxpr must contain;
    body_op: a primitive of the kernels' bodies, showing that their text is part of what is
    searched for 'atomic'."""
    run = jax.jit(kernel)
    first, second = run(*inputs), run(*inputs)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    program = str(jax.make_jaxpr(kernel)(*inputs))
    for name in program_names:
        assert name in program
    assert body_op in program
    assert 'atomic' not in program
