"""absl's warnings, Orbax's among them, kept out of normal runs; --verbose shows them.

Orbax logs through absl a warning for every item saved without its own _CHECKPOINT_METADATA
(`Metadata file does not exist: .../params/_CHECKPOINT_METADATA`), which is how the trainer's
checkpoints are written: a user of the trainer (`--init_from`, `--resume_from`), `jaxtrain.ckpt` or
`jaxtrain.generate` would read it as a damaged checkpoint. Every entry point runs its work inside
quiet_absl(not verbose). Only absl's own logger is raised to ERROR: JAX's warnings go through
Python's logging under their own names and still show. No JAX import here, so a tool can enter it
before JAX starts.
"""

import contextlib
import logging


@contextlib.contextmanager
def quiet_absl(quiet: bool = True):
    """absl's logger at ERROR while the block runs (when `quiet`), its level as it was afterwards."""
    logger = logging.getLogger('absl')
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
