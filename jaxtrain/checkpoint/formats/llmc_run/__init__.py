"""llm.c's run folders (model_%08d.bin, state_%08d_%05d.bin, DONE_%08d) as a checkpoint format.

restore.py     LLMCRunFormat: verify a step, restore it into a run, its weights, what `ckpt` asks.
writer.py      our state as a step train_gpt2cu -y 1 resumes: `--checkpoint_format llmc`'s saves, and
               `ckpt export --format llmc-run` of a jaxtrain checkpoint.
inspection.py  locate and read a step; `ckpt ls|show` of a run folder, the refusal of the others.
"""
