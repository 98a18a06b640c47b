"""InfiniTrain's step directories, every generation (HEAD, PR, PR 151's scheduler file) and rank layout.

steps.py       on disk: kind detection, reading into NumPy trees, atomic writing, pruning.
record.py      the "jaxtrain" object jaxtrain adds to trainer_state.json, checked.
trainer.py     the bridge to the trainer: optax state <-> Adam moments, the data position, live trees.
schedule.py    lr_scheduler.ckpt <-> the run's schedule.
saver.py       InfiniTrainFormat (resume, verify, weights) and the run's background checkpointer.
inspection.py  `ckpt ls|show|verify|export` rows and exports of these directories.
"""
