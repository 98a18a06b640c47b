"""`ckpt export --merge-lora`: a LoRA checkpoint's adapters folded into its base model.

A LoRA checkpoint holds no base weights (checkpoint/lora_record.py): the base is the llm.c
file its trainer state names, or the random init of its recorded seed drawn again, checked by
sha256 before anything is merged. The merged
tree is the base tree with W + (α/r)·B·A in each adapted projection (models/lora.py), the
GPT-2 head still tied to wte, ready for the plain llm.c writers.
"""

from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.checkpoint.lora_record import base_params


def merge_for_export(step_dir, state: dict, adapters: dict, merge_lora: bool, base: str) -> dict:
    """The tree to export: `adapters` merged into the base for a LoRA checkpoint with
    --merge-lora; a LoRA checkpoint without it, or --merge-lora on a plain one, is refused."""
    from jaxtrain.models.lora import merged_params

    lora = state.get('lora')
    if not lora:
        if merge_lora:
            raise CheckpointError(
                f'--merge-lora: {step_dir}: expected a LoRA checkpoint, found a full one (no lora in its '
                'trainer state); export it without --merge-lora'
            )
        return adapters
    if not merge_lora:
        raise CheckpointError(
            f"{step_dir}: a LoRA checkpoint holds adapters only (rank {lora.get('rank')}, "
            f"{lora.get('num_parameters', 0):,} parameters), not a model; pass --merge-lora to fold "
            "them into "
            f"its base {state.get('llmc_file') or '(the random init of its seed)'} and export the result"
        )
    return merged_params(base_params(state, base, step_dir), adapters, lora)
