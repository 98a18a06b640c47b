"""`ckpt export --merge-lora`: a LoRA checkpoint's adapters folded into its base model.

A LoRA checkpoint holds no base weights (checkpoint/lora_record.py): the base is the llm.c
file its trainer state names, checked here by sha256 before anything is merged. The merged
tree is the base tree with W + (α/r)·B·A in each adapted projection (models/lora.py), the
GPT-2 head still tied to wte, ready for the plain llm.c writers.
"""

import os
from pathlib import Path

from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.checkpoint.lora_record import base_sha256


def _base_params(state: dict, base: str):
    import llmc_io

    recorded, sha_then = state.get('llmc_file', ''), state.get('llmc_sha256', '')
    if not recorded:
        raise CheckpointError(
            'trainer_state: llmc_file: expected the base llm.c file the adapters were trained on, found none '
            '(the base was a random init); export its base first, or train LoRA from an llm.c file'
        )
    path = base or recorded
    if not Path(path).is_file():
        raise CheckpointError(
            f'--base: {path}: expected the base llm.c file (sha256 {sha_then}), found nothing there; '
            'pass --base FILE where it is now'
        )
    sha_now = base_sha256(path)
    if sha_now != sha_then:
        raise CheckpointError(
            f'--base: {path}: expected the base the adapters were trained on ({recorded}, sha256 '
            f'{sha_then}), '
            f'found sha256 {sha_now}; pass that file with --base'
        )
    training = state.get('training_config') or {}
    if state.get('model_family') == 'llama3':
        overrides = {}
        if training.get('llmc_ffn_dim_multiplier'):
            overrides['ffn_dim_multiplier'] = training['llmc_ffn_dim_multiplier']
        if training.get('llmc_norm_eps'):
            overrides['norm_eps'] = training['llmc_norm_eps']
        return llmc_io.load_llama3(os.fspath(path), **overrides)[1]
    return llmc_io.load_gpt2(os.fspath(path))[1]


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
            f"its base {state.get('llmc_file') or '(random init)'} and export the result"
        )
    return merged_params(_base_params(state, base), adapters, lora)
