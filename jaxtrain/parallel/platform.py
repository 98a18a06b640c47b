"""`--device cpu|cuda` (InfiniTrain's flag, the config key `device`): which JAX platform.

`request` runs before JAX starts a backend (before distributed init); `check` after, so
that asking for cuda where JAX finds no GPU is one clear error instead of a silent CPU run.
'auto' leaves JAX's own choice (JAX_PLATFORMS, else a GPU when there is one).
"""

import jax


def request(device: str) -> None:
    if device == 'cpu' and jax.config.jax_platforms != 'cpu':
        jax.config.update('jax_platforms', 'cpu')


def check(device: str) -> None:
    found = jax.default_backend()
    if device == 'cuda' and found != 'gpu':
        raise ValueError(
            f'device: expected a CUDA GPU for --device cuda, found JAX on {found} only; '
            'pass --device cpu (or install jax[cuda12] on a machine with a GPU)'
        )
    if device == 'cpu' and found != 'cpu':
        raise ValueError(f'device: expected the CPU backend for --device cpu, found {found}')
