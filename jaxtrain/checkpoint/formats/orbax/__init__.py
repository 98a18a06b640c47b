"""jaxtrain's own step directories, written by Orbax (checkpoint/manager.py saves them).

restore.py     OrbaxFormat: the restore into a run and its checks, the weights for --init_from.
inspection.py  listing, reading, checksums and verification of a step, for `ckpt` and every way in.
listing.py     `ckpt ls` of a root of step directories (every format's), `ckpt show` of ours.
export.py      `ckpt export --format llmc|hf`: our params as an llm.c file or a Hugging Face folder.
"""
