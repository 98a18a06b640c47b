"""llm.c's run folders (model_%08d.bin, state_%08d_%05d.bin, DONE_%08d) as a checkpoint format.

restore.py     LLMCRunFormat: verify a step, restore it into a run, its weights, what `ckpt` asks.
saver.py       `--checkpoint_format llmc`: a run saving into a folder train_gpt2cu -y 1 resumes.
inspection.py  locate and read a step; `ckpt ls|show` of a run folder, the refusal of the others.
export.py      `ckpt export --format llmc-run`: a jaxtrain checkpoint as an llm.c run folder step.
"""
