"""jaxtrain: GPT-2 and LLaMA-3 training in JAX that reads and writes llm.c and InfiniTrain files."""

import sys

# Said first, in one line: on an older Python the first failure would otherwise be a missing jax
# 0.11 (it requires 3.12) or a syntax error deep in a module.
if sys.version_info < (3, 12):
    raise SystemExit(
        f'jaxtrain needs Python 3.12 or newer; this is Python {sys.version.split()[0]} ({sys.executable})'
    )
