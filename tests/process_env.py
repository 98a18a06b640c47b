"""The environment of a trainer process that a test starts.

One CPU device, as a user's run has, and otherwise the test process's XLA flags
(tests/conftest.py). JAX's persistent compilation cache keys on XLA_FLAGS, all but the fake
device count: with the same flags, the process and the test process share the session's
compiled programs, where XLA_FLAGS='' would compile each of them again.
"""

import os

DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count'


def one_device_env(**overrides) -> dict:
    flags = [f for f in os.environ.get('XLA_FLAGS', '').split() if not f.startswith(DEVICE_COUNT_FLAG)]
    return {**os.environ, 'XLA_FLAGS': ' '.join(flags), **overrides}
