"""Adam's elementwise update of many parameter tensors, as Pallas (Triton) kernels.

What it replaces: optax's adamw is a chain of tree maps (the moments, the bias correction,
the weight decay, the learning rate), and optax.apply_updates adds the result to the
parameters; XLA fuses each tensor's share of those into kernels of its own, so GPT-2 124M's
~150 tensors make hundreds of small launches. Here one program takes BLOCK elements of one
tensor, reads p, g, m and v once and writes p', m' and v' once (in place: the outputs alias
the inputs). One call covers up to TENSORS_PER_CALL tensors without concatenating them: the
grid counts every tensor's blocks one after another, and each program finds its tensor by
its block index (a static branch per tensor), as PyTorch's multi-tensor Adam does.

The arithmetic is optax's (0.2.x scale_by_adam, add_decayed_weights, scale_by_schedule,
apply_updates, and clip_by_global_norm before them), operation for operation and in the
same order and dtype, so that Pallas' interpreter on CPU gives the same bits as optax:

    g  = g                     if norm < max_norm else (g / norm) * max_norm    (clipping)
    m' = (1 - b1) * g + b1 * m
    v' = (1 - b2) * g**2 + b2 * v
    u  = (m' / c1) / (sqrt(v' / c2 + eps_root) + eps)    c1 = 1 - b1**t, c2 = 1 - b2**t
    u  = u + wd * p            on tensors that decay, when wd != 0
    p' = p + step * u          step = -lr

The scalars (c1, c2, step, the norm and whether it clips) come in computed by the caller
with optax's own expressions. Elementwise with no reductions, the kernel is deterministic.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Elements per program (a power of two, as Triton's blocks must be) and warps per program.
BLOCK = 2048
NUM_WARPS = 4
# Tensors per call: each takes seven pointers (p, g, m, v in; p', m', v' out) of the kernel's
# parameter space, and a branch of its code.
TENSORS_PER_CALL = 16


def _kernel(*refs, sizes, starts, decays, hyper, clip, block):
    k = len(sizes)
    scalars, refs = refs[: 5 if clip else 3], refs[5 if clip else 3 :]
    p_refs, g_refs, m_refs, v_refs = (refs[i * k : (i + 1) * k] for i in range(4))
    p_out, m_out, v_out = (refs[(4 + i) * k : (5 + i) * k] for i in range(3))
    b1, b2, eps, eps_root, weight_decay, max_norm = hyper
    pid = pl.program_id(0)

    for i in range(k):

        @pl.when((pid >= starts[i]) & (pid < starts[i + 1]))
        def _update(i=i):
            index = (pid - starts[i]) * block + jnp.arange(block)
            mask = index < sizes[i]
            load = lambda ref: plgpu.load(ref.at[index], mask=mask, other=0.0)
            p, g, m, v = load(p_refs[i]), load(g_refs[i]), load(m_refs[i]), load(v_refs[i])
            c1, c2, step = (ref[...] for ref in scalars[:3])
            if clip:
                norm, small = scalars[3][...], scalars[4][...]
                g = jnp.where(small != 0, g, (g / norm.astype(g.dtype)) * max_norm)
            m = (1 - b1) * g + b1 * m
            v = (1 - b2) * (g * g) + b2 * v
            u = (m / c1.astype(m.dtype)) / (jnp.sqrt(v / c2.astype(v.dtype) + eps_root) + eps)
            if decays[i] and weight_decay != 0.0:
                u = u + weight_decay * p
            p_new = (p + step.astype(u.dtype) * u).astype(p.dtype)
            for ref, value in ((p_out[i], p_new), (m_out[i], m), (v_out[i], v)):
                plgpu.store(ref.at[index], value.astype(ref.dtype), mask=mask)


def adam_update(
    p_list,
    g_list,
    m_list,
    v_list,
    decays,
    scalars,
    *,
    b1: float,
    b2: float,
    eps: float,
    eps_root: float = 0.0,
    weight_decay: float = 0.0,
    max_norm: float | None = None,
    block: int = BLOCK,
    tensors_per_call: int = TENSORS_PER_CALL,
    interpret=None,
):
    """(p', m', v') lists for the lists of 1-D tensors p, g, m, v (same lengths and sizes).

    decays: per tensor, whether weight decay applies. scalars: (c1, c2, step) or, with
    max_norm (global-norm clipping), (c1, c2, step, norm, norm < max_norm) as 0-d arrays.
    interpret (default: off a GPU) runs the kernels through Pallas' interpreter, which is how
    the CPU tests check them.
    """
    if interpret is None:
        interpret = jax.default_backend() != 'gpu'
    clip = max_norm is not None
    scalars = [jnp.asarray(s, jnp.float32) for s in scalars[:4]] + [
        jnp.asarray(s, jnp.int32) for s in scalars[4:]
    ]
    if len(scalars) != (5 if clip else 3):
        raise ValueError(
            f'scalars: expected {5 if clip else 3} with max_norm {max_norm}, found {len(scalars)}'
        )
    hyper = (b1, b2, eps, eps_root, weight_decay, max_norm)
    outs = ([], [], [])
    for first in range(0, len(p_list), tensors_per_call):
        group = slice(first, first + tensors_per_call)
        ps, gs, ms, vs = p_list[group], g_list[group], m_list[group], v_list[group]
        sizes = tuple(int(p.shape[0]) for p in ps)
        starts = [0]
        for size in sizes:
            starts.append(starts[-1] + pl.cdiv(size, block))
        k = len(ps)
        kernel = functools.partial(
            _kernel,
            sizes=sizes,
            starts=tuple(starts),
            decays=tuple(bool(d) for d in decays[group]),
            hyper=hyper,
            clip=clip,
            block=block,
        )
        out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (*ps, *ms, *vs)]
        n_scalars = len(scalars)
        # p -> p', m -> m', v -> v': the update happens in the buffers it reads.
        aliases = {n_scalars + i: i for i in range(k)}
        aliases |= {n_scalars + 2 * k + i: k + i for i in range(k)}
        aliases |= {n_scalars + 3 * k + i: 2 * k + i for i in range(k)}
        results = pl.pallas_call(
            kernel,
            out_shape=out_shape,
            grid=(starts[-1],),
            input_output_aliases=aliases,
            compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=1),
            interpret=interpret,
            name='adam_update',
        )(*scalars, *ps, *gs, *ms, *vs)
        for i, out in enumerate(outs):
            out.extend(results[i * k : (i + 1) * k])
    return outs
