"""setuptools' build backend (pyproject.toml's build-backend), after one check: the Python
that builds jaxtrain can run it.

pip compares a project's requires-python only after it has resolved the dependencies, so a
Python 3.11 `pip install .` ended on `No matching distribution found for jax==0.11.2` (jax
0.11 requires 3.12) and never said why. The backend runs under the Python being installed
into, before any dependency is looked at, so saying it here makes it pip's first error.
"""

import platform
import sys

from setuptools.build_meta import *  # noqa: F403  the PEP 517 and PEP 660 hooks, unchanged

REQUIRED = (3, 12)  # pyproject.toml's requires-python

if sys.version_info < REQUIRED:
    raise SystemExit(
        f'jaxtrain needs Python {REQUIRED[0]}.{REQUIRED[1]} or newer (its pinned jax 0.11.2 does); '
        f'this pip runs Python {platform.python_version()} ({sys.executable}). '
        f'Install with a Python 3.12: python3.12 -m pip install .'
    )
