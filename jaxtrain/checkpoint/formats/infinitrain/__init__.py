"""InfiniTrain's step directories, every generation (HEAD, PR, PR 151's scheduler file) and rank layout.

steps.py       on disk: the generations (GENERATIONS), kind detection, reading into NumPy trees, pruning.
writer.py      writing a step directory of any generation and topology, atomically.
trainer.py     the bridge to the trainer: optax state <-> Adam moments, the data position, live trees.
schedule.py    lr_scheduler.ckpt <-> the run's schedule.
format.py      InfiniTrainFormat: owns, steps, resume, verify, weights, `ckpt`, for one generation.
saver.py       the run's background checkpointer.
inspection.py  `ckpt ls|show|verify|diff` of these directories; the "jaxtrain" object of
               trainer_state.json, checked (for resume too).
export.py      `ckpt export` into these directories.
"""
