"""Checkpoint formats other than our own Orbax directories.

infinitrain.py          InfiniTrain step directories on disk (both generations, rank_* subdirectories):
                        kind detection, reading into NumPy trees, atomic writing, pruning.
infinitrain_trainer.py  the bridge to the trainer: optax state <-> Adam moments, the data position,
                        read_step_dir / save_step_dir on live (sharded) JAX trees.
infinitrain_saver.py    a Checkpointer look-alike the run's save policy can drive, and the resume hook.
"""
