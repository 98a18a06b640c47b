"""The optimizer and its learning-rate schedules: optax transforms built from a config, and
InfiniTrain's schedulers replayed in float32. Below train/ and checkpoint/, which both use
them (a checkpoint format saves and restores a schedule's state)."""
