"""Does deterministic cuDNN attention run with several calls in one step once the calls are made
distinct (models/attention.py, distinct_calls)? GPU only; run it before measuring the loop.

  python launch/cudnn_deterministic_probe.py [LAYERS=12] [B=16] [T=1024] [N=12] [H=64]

Sets --xla_gpu_deterministic_ops=true before JAX starts, then jits LAYERS chained attention
calls of GPT-2 124M's shape, forward and backward, three ways, and prints for each whether it
ran, whether two runs gave the same bits, and its median ms per layer:
  identical  every call the plain one (expected to fail on jax 0.11.2: openxla/xla PR 46500)
  distinct   call i with queries 2^e_i q and scale 2^-e_i / sqrt(H) (attention.scaled_queries)
  pallas     the Pallas kernel that deterministic runs take today
It also checks that a scaled call gives the same bits as the plain one (one call, which runs).
"""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' --xla_gpu_deterministic_ops=true').strip()

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from kernel_timing import integer_args, median_ms  # noqa: E402  (launch/, beside this script)
from jaxtrain.models import attention  # noqa: E402


def chain(layers: int, mode: str, first_index: int = 0):
    """grad of sum(out * do) through `layers` attention calls, each feeding the next's queries;
    `distinct` numbers the calls from first_index."""

    def attend(q, k, v, index):
        if mode == 'pallas':
            return attention.causal_attention(q, k, v, 'pallas')
        q, scale = attention.scaled_queries(q, index if mode == 'distinct' else None)
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, implementation='cudnn')

    def loss(q, k, v, do):
        for i in range(layers):
            q = attend(q, k, v, first_index + i)
        return jnp.sum(q.astype(jnp.float32) * do)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def main(layers=12, B=16, T=1024, N=12, H=64):
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(key, (B, T, N, H), jnp.bfloat16) for key in keys)
    for mode in ('identical', 'distinct', 'pallas'):
        fn = chain(layers, mode)
        try:
            first = [np.asarray(g, np.float32) for g in fn(q, k, v, do)]
            again = [np.asarray(g, np.float32) for g in fn(q, k, v, do)]
            same = all(np.array_equal(a, b) for a, b in zip(first, again))
            ms = median_ms(fn, q, k, v, do) / layers
            print(f'{mode:10s} ran; twice {"bitwise equal" if same else "DIFFERENT"}; {ms:.3f} ms/layer', flush=True)
        except Exception as error:  # the failure being probed: say which, and go on
            print(f'{mode:10s} failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}', flush=True)
    # Call index 3 scales the queries by 2^2: the same bits as the plain call, on cuDNN too?
    one_plain = [np.asarray(g, np.float32) for g in chain(1, 'identical')(q, k, v, do)]
    one_scaled = [np.asarray(g, np.float32) for g in chain(1, 'distinct', first_index=3)(q, k, v, do)]
    equal = all(np.array_equal(a, b) for a, b in zip(one_plain, one_scaled))
    print(f'one call, 2^2-scaled queries against the plain call: {"bitwise equal" if equal else "DIFFERENT"}')

if __name__ == '__main__':
    main(*integer_args(__doc__, 5))
