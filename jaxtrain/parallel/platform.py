"""Which JAX platform a run uses and how XLA's kernels behave there, settled before JAX starts.

`--device cpu|cuda` (InfiniTrain's flag, the config key `device`): `request` runs before JAX
starts a backend (before distributed init); `check` after, so that asking for cuda where JAX
finds no GPU is one clear error instead of a silent CPU run. 'auto' leaves JAX's own choice
(JAX_PLATFORMS, else a GPU when there is one).

XLA's switch for deterministic GPU kernels, DETERMINISTIC_FLAG, is set and read here too. XLA
reads XLA_FLAGS once, when the backend starts (the first jax.devices()), not at `import jax`:
`request_deterministic` must run before that. JAX is imported inside the functions that need
it, so the command-line entry points can import this module and set the flag first.
"""

import os

DETERMINISTIC_FLAG = '--xla_gpu_deterministic_ops'


def request(device: str) -> None:
    import jax

    if device == 'cpu' and jax.config.jax_platforms != 'cpu':
        jax.config.update('jax_platforms', 'cpu')


def check(device: str) -> None:
    import jax

    found = jax.default_backend()
    if device == 'cuda' and found != 'gpu':
        raise ValueError(
            f'device: expected a CUDA GPU for --device cuda, found JAX on {found} only; '
            'pass --device cpu (or install jax[cuda12] on a machine with a GPU)'
        )
    if device == 'cpu' and found != 'cpu':
        raise ValueError(f'device: expected the CPU backend for --device cpu, found {found}')


def request_deterministic(deterministic: bool):
    """Adds DETERMINISTIC_FLAG=true to XLA_FLAGS when asked; deterministic ops also pin GEMM
    choices. An inherited setting of the flag is left as it is."""
    if deterministic:
        current = os.environ.get('XLA_FLAGS', '')
        if DETERMINISTIC_FLAG not in current:
            os.environ['XLA_FLAGS'] = (current + f' {DETERMINISTIC_FLAG}=true').strip()


def pinned_to_cpu(device: str) -> bool:
    """Whether a run with config.device `device` can only run on the CPU (--device cpu, or
    JAX_PLATFORMS=cpu). DETERMINISTIC_FLAG changes no CPU kernel (XLA's CPU ops are
    deterministic already), but JAX's compilation cache keys on XLA_FLAGS: such a run leaves it
    out, so that a run that saves reuses the compiled programs of one that does not."""
    return device == 'cpu' or os.environ.get('JAX_PLATFORMS', '').strip().lower() == 'cpu'


def deterministic_in_effect() -> bool:
    """Whether this process's XLA runs deterministic kernels (what XLA_FLAGS says)."""
    return f'{DETERMINISTIC_FLAG}=true' in os.environ.get('XLA_FLAGS', '')
