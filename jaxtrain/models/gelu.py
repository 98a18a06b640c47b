"""GPT-2's tanh-GELU with a backward pass that recomputes from the input.

Differentiated by autodiff, `jax.nn.gelu(x, approximate=True)` keeps tanh(...) of the forward
pass as a second residual beside x: at GPT-2 124M, batch 16 x 1024, the forward fusion then
writes two B·T·4C tensors (100 MB each in bf16) and the backward reads three, per layer
(an H200 profile of the step). Saving only x and recomputing tanh in the backward
(free in a memory-bound fusion) moves 200 MB less per layer. The forward values are jax's own;
the derivative is computed in fp32 and rounded once to x's dtype.
"""

import math

import jax
import jax.numpy as jnp

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_CUBIC = 0.044715


@jax.custom_vjp
def gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as jax.nn.gelu(approximate=True)."""
    return jax.nn.gelu(x, approximate=True)


def _forward(x):
    return gelu_tanh(x), x


def _backward(x, g):
    x32 = x.astype(jnp.float32)
    t = jnp.tanh(_SQRT_2_OVER_PI * (x32 + _CUBIC * x32 * x32 * x32))
    slope = 0.5 * (1 + t) + 0.5 * x32 * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _CUBIC * x32 * x32)
    return ((g.astype(jnp.float32) * slope).astype(g.dtype),)


gelu_tanh.defvjp(_forward, _backward)
