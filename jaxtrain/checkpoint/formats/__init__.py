"""The checkpoint formats, each a format.CheckpointFormat that registry.py maps flags and step
directories to. None of them imports resume.py or the registry.

orbax.py                our own step directories (manager.py writes them): restore and its checks.
infinitrain.py          InfiniTrain step directories on disk (both generations, rank_* subdirectories):
                        kind detection, reading into NumPy trees, atomic writing, pruning.
infinitrain_trainer.py  the bridge to the trainer: optax state <-> Adam moments, the data position,
                        read_step_dir / save_step_dir on live (sharded) JAX trees.
infinitrain_saver.py    InfiniTrainFormat and the run's background InfiniTrainCheckpointer.
"""
