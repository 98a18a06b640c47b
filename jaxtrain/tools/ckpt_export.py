"""A checkpoint's params as an llm.c model file, written through llmc_io, for `--llmc_filepath`.

GPT-2 goes to llm.c's layout (version 3 fp32 or 5 bf16; the head is tied to wte, so there is no
lm_head to write), LLaMA-3 to InfiniTrain's layout (version 3 only: save_llama3 writes fp32). The
header comes from trainer_state's model_config: the config dataclasses and the llmc_io headers
share their field names (llmc_io/PARAMS_SPEC.md). The params are verified against their recorded checksums
before anything is written, so damaged weights are never exported.
"""

import dataclasses
import math
import os
from pathlib import Path

import numpy as np

import llmc_io
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.checkpoint.trainer_state import read_trainer_state
from jaxtrain.checkpoint.checksums import checksum_mismatches
from jaxtrain.tools.ckpt_inspect import flatten, model_config_object, restore_item

VERSIONS = {3: 'float32', 5: 'bfloat16'}


def export_llmc(step_dir, output, version: int = 3) -> dict:
    """Writes the file; returns what was written, for the report."""
    step_dir, output = Path(step_dir), Path(output)
    if not output.parent.is_dir():
        raise CheckpointError(
            f'--output: {output}: expected a file in an existing directory, found no {output.parent}'
        )
    if version not in VERSIONS:
        raise CheckpointError(f'--version: expected 3 (fp32) or 5 (bf16, GPT-2 only), found {version}')
    state = read_trainer_state(step_dir)
    family = state.get('model_family')
    config = model_config_object(family, state.get('model_config'))
    if family == 'llama3' and version != 3:
        raise CheckpointError(
            f'--version: expected 3 for LLaMA-3 (save_llama3 writes the InfiniTrain layout, fp32 only), '
            f'found {version}'
        )
    params = restore_item(step_dir, 'params')
    mismatches = checksum_mismatches(params, state.get('checksums', {}).get('params', {}), 'params')
    if mismatches:
        raise CheckpointError(
            f'{step_dir}: refusing to export params that fail verification: {"; ".join(mismatches)}'
        )

    header_cls = {'gpt2': llmc_io.GPT2Header, 'llama3': llmc_io.LLaMA3Header}[family]
    header = header_cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(header_cls)})
    notes = []
    if family == 'gpt2':
        # The trainer masks the padded logit columns, so these rows never touch the loss.
        padding = params['wte']['embedding'][header.vocab_size :]
        if padding.size and np.any(padding):
            notes.append(
                f'wte rows {header.vocab_size}..{header.padded_vocab_size - 1} (vocabulary padding) were '
                'nonzero and are written as zeros, as llm.c files hold them; the loss is unchanged'
            )
        llmc_io.save_gpt2(os.fspath(output), header, params, version=version)
    else:
        llmc_io.save_llama3(os.fspath(output), header, params)
    return {
        'output': os.fspath(output),
        'model_family': family,
        'version': version,
        'dtype': VERSIONS[version],
        'num_parameters': int(sum(math.prod(a.shape) for a in flatten(params).values())),
        'size_bytes': output.stat().st_size,
        'notes': notes,
    }
