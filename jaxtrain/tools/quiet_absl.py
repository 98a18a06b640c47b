"""Orbax's warnings that are normal when a tool reads a checkpoint, silenced while it reads.

Orbax logs through absl a warning for every item saved without its own _CHECKPOINT_METADATA
(`Metadata file does not exist: .../params/_CHECKPOINT_METADATA`), which is how the trainer's
checkpoints are written; a user of `jaxtrain.ckpt` or `jaxtrain.generate` would read it as a
damaged checkpoint. No JAX import here, so a tool can enter it before JAX starts.
"""

import contextlib
import logging


@contextlib.contextmanager
def quiet_absl():
    """absl's logger at ERROR while the block runs, its level as it was afterwards."""
    logger = logging.getLogger('absl')
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
