"""The checkpoint formats, one package a kind, each with its format.CheckpointFormat that
registry.py maps flags and step directories to. None of them imports resume.py or the registry.

orbax/        our own step directories.
infinitrain/  InfiniTrain's step directories, every generation and rank layout.
llmc_run/     llm.c's run folders.
"""
