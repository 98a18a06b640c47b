"""XLA's switch for deterministic GPU kernels, set and read in one place.

XLA reads XLA_FLAGS once, when the backend starts (the first jax.devices()), not at
`import jax`: `request` must run before that. This module imports nothing from JAX so the
command-line entry points can call it first.
"""

import os

FLAG = '--xla_gpu_deterministic_ops'


def request(deterministic: bool):
    """Adds FLAG=true to XLA_FLAGS when asked; deterministic ops also pin GEMM choices.
    An inherited setting of FLAG is left as it is."""
    if deterministic:
        current = os.environ.get('XLA_FLAGS', '')
        if FLAG not in current:
            os.environ['XLA_FLAGS'] = (current + f' {FLAG}=true').strip()


def pinned_to_cpu(device: str) -> bool:
    """Whether a run with config.device `device` can only run on the CPU (--device cpu, or
    JAX_PLATFORMS=cpu). FLAG changes no CPU kernel (XLA's CPU ops are deterministic already),
    but JAX's compilation cache keys on XLA_FLAGS: such a run leaves it out, so that a run that
    saves reuses the compiled programs of one that does not."""
    return device == 'cpu' or os.environ.get('JAX_PLATFORMS', '').strip().lower() == 'cpu'


def in_effect() -> bool:
    """Whether this process's XLA runs deterministic kernels (what XLA_FLAGS says)."""
    return f'{FLAG}=true' in os.environ.get('XLA_FLAGS', '')
