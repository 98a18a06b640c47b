"""Tests run on the CPU backend with 8 fake devices (set before JAX is imported)."""

import os
import sys
from pathlib import Path

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
if '--xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (
        os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
    ).strip()

sys.path.insert(0, str(Path(__file__).resolve().parent))  # numpy_reference, helpers
