"""Tests run on the CPU backend with 8 fake devices (set before JAX is imported).

The trainer's runs in these tests compile the same few programs again and again, so a
persistent XLA compilation cache for the session cuts minutes off the suite. Compiles are most
of the suite's CPU, and a tiny model runs no faster for XLA's optimizing passes, so tests skip
most of them (jax_disable_most_optimizations: a third less CPU). It is an environment variable
so that the trainer processes a test starts, even with XLA_FLAGS cleared, compile as the test
process does: bitwise comparisons between the two stay like for like. A test marked
`xla_optimized` compiles as a user's run does (XLA's unoptimized CPU code computes tanh less
accurately in its tails than a tight NumPy tolerance allows).
"""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
if '--xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (
        os.environ.get('XLA_FLAGS', '')
        + ' --xla_force_host_platform_device_count=8'
        # 8 fake devices on 2 busy cores can keep a collective waiting past XLA's default 40 s,
        # which aborts the whole test process; a starved CI machine is not a deadlock.
        + ' --xla_cpu_collective_call_terminate_timeout_seconds=600'
    ).strip()
_CACHE = Path(__file__).resolve().parents[1] / '.pytest_cache' / 'xla-compilation'
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', str(_CACHE))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')

sys.path.insert(0, str(Path(__file__).resolve().parent))  # numpy_reference, trainer_runs


@pytest.fixture(autouse=True)
def _xla_optimized(request):
    """For a test marked xla_optimized: XLA's optimizations on, and no program compiled without
    them taken from JAX's in-memory caches. Module-scoped fixtures have compiled before this
    runs, so what such a test compares against is what they built unoptimized."""
    if request.node.get_closest_marker('xla_optimized') is None:
        yield
        return
    import jax

    before = jax.config.read('jax_disable_most_optimizations')
    jax.clear_caches()
    jax.config.update('jax_disable_most_optimizations', False)
    try:
        yield
    finally:
        jax.config.update('jax_disable_most_optimizations', before)
        jax.clear_caches()


@pytest.fixture(scope='session')
def files(tmp_path_factory):
    """The suite's tiny GPT-2 llm.c model and a shard it learns from, made once a session, as the
    config keys that name them. Read only: a test that changes a file makes its own. A test file
    that needs more keys or another form overrides this fixture and asks for it (`files(files)`)."""
    from types import MappingProxyType

    from trainer_runs import random_shard, tiny_llmc_model

    root = tmp_path_factory.mktemp('files')
    return MappingProxyType(
        {'input_bin': random_shard(root / 'train.bin'), 'llmc_filepath': tiny_llmc_model(root / 'model.bin')}
    )


@pytest.fixture
def disk_full_for(monkeypatch):
    """disk_full_for('state_'): from then on, a file written through llmc_io's atomic_output whose
    name starts so is written to /dev/full, where the kernel fails the write with ENOSPC as a full
    disk does; other files are written as usual."""
    import tempfile

    real_mkstemp = tempfile.mkstemp

    def install(name_start: str):
        def mkstemp(*args, **kwargs):
            fd, tmp = real_mkstemp(*args, **kwargs)
            if os.path.basename(tmp).startswith(name_start):
                os.close(fd)
                fd = os.open('/dev/full', os.O_WRONLY)
            return fd, tmp

        monkeypatch.setattr(tempfile, 'mkstemp', mkstemp)

    return install
