"""A checkpoint's params as an llm.c model file, written through llmc_io, for `--llmc_filepath`,
or as a Hugging Face folder (llmc_io.hf: GPT2LMHeadModel / LlamaForCausalLM; float32, bfloat16 or
float16, sharded past --max_shard_size).

GPT-2 goes to llm.c's layout (version 3 fp32 or 5 bf16; the head is tied to wte, so there is no
lm_head to write), LLaMA-3 to InfiniTrain's layout (version 3 only: save_llama3 writes fp32). The
header comes from trainer_state's model_config: the config dataclasses and the llmc_io headers
share their field names (llmc_io/PARAMS_SPEC.md). The params are verified against their recorded checksums
before anything is written, so damaged weights are never exported.

`ckpt export --merge-lora`: a LoRA checkpoint's adapters folded into its base model.

A LoRA checkpoint holds no base weights (checkpoint/resume_checks.py): the base is the llm.c
file its trainer state names, or the random init of its recorded seed drawn again, checked by
sha256 before anything is merged. The merged
tree is the base tree with W + (α/r)·B·A in each adapted projection (models/lora.py), the
GPT-2 head still tied to wte, ready for the plain llm.c writers.

write_llmc and write_hf are `ckpt export --format llmc|hf` (export_target.TARGETS): from our steps
only; an InfiniTrain PR step holds an llm.c model.bin already.
"""

import dataclasses
import math
import os
from pathlib import Path
import numpy as np

import llmc_io
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.checkpoint.trainer_state import read_trainer_state
from jaxtrain.checkpoint.manager import checksum_mismatches
from jaxtrain.checkpoint.ckpt_text import human_bytes
from jaxtrain.checkpoint.formats.orbax.inspection import (
    find_finished_step_dir,
    flatten,
    host_checksums,
    model_config_object,
    restore_item,
)
from jaxtrain.checkpoint.export_target import check_file_output, check_hf_output, refuse_base_file
from jaxtrain.checkpoint.resume_checks import base_params


VERSIONS = {3: 'float32', 5: 'bfloat16'}


def verified_params(step_dir, merge_lora: bool = False, base: str = '') -> tuple[str, object, dict]:
    """(model family, llmc_io header, params) of a step, the params checked against their
    checksums; a LoRA checkpoint's adapters folded into its base (merge_lora), else refused."""
    state = read_trainer_state(step_dir)
    family = state.get('model_family')
    config = model_config_object(family, state.get('model_config'))
    params = restore_item(step_dir, 'params')
    found = host_checksums(flatten(params))
    mismatches = checksum_mismatches(found, state.get('checksums', {}).get('params', {}), 'params')
    if mismatches:
        raise CheckpointError(
            f'{step_dir}: refusing to export params that fail verification: {"; ".join(mismatches)}'
        )
    params = merge_for_export(step_dir, state, params, merge_lora, base)
    header_cls = {'gpt2': llmc_io.GPT2Header, 'llama3': llmc_io.LLaMA3Header}[family]
    header = header_cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(header_cls)})
    return family, header, params


def _run_tokenizer(step_dir, family: str, given: str):
    """The BPE tokenizer to export beside the model: --tokenizer, else the one the run named."""
    from llmc_io.text.bpe import load_text_tokenizer

    named = read_trainer_state(step_dir).get('training_config', {}).get('tokenizer', '')
    path = given or named
    if not path:
        return None
    if not os.path.isfile(path):
        raise CheckpointError(
            f'--tokenizer: {path}: expected the tokenizer file {"the run named" if not given else "given"}, '
            f'found nothing there; pass --tokenizer with its new path'
        )
    return load_text_tokenizer(path, family)


def export_hf(
    step_dir,
    output,
    merge_lora: bool = False,
    base: str = '',
    force: bool = False,
    tokenizer: str = '',
    dtype: str = 'float32',
    max_shard_size: str | None = None,
) -> dict:
    """Writes a Hugging Face folder through llmc_io.hf (config.json, generation_config.json, and
    model.safetensors or shards past `max_shard_size`, as `dtype`), and the run's BPE tokenizer
    (tokenizer.json, tokenizer_config.json) when it names one (or `tokenizer` is given); an
    existing folder's files only with `force` (export_target.py)."""
    from llmc_io.hf import save_hf
    from llmc_io.text.tokenizer_files import write_hf_tokenizer_files
    from llmc_io.hf.weights import DEFAULT_MAX_SHARD_SIZE, parse_size

    try:
        shard_bytes = parse_size(max_shard_size or DEFAULT_MAX_SHARD_SIZE)
    except ValueError as e:
        raise CheckpointError(f'--max_shard_size: {e}') from None
    output = Path(output)
    check_hf_output(output, force)
    family, header, params = verified_params(Path(step_dir), merge_lora, base)
    text_tokenizer = _run_tokenizer(step_dir, family, tokenizer)
    written = save_hf(output, header, params, dtype, shard_bytes)
    if text_tokenizer is not None:
        written += write_hf_tokenizer_files(text_tokenizer, output, header.max_seq_len)
    return {
        'output': os.fspath(output),
        'files': written,
        'model_family': family,
        'hf_class': {'gpt2': 'GPT2LMHeadModel', 'llama3': 'LlamaForCausalLM'}[family],
        'dtype': dtype,
        'num_parameters': int(sum(math.prod(a.shape) for a in flatten(params).values())),
        'size_bytes': sum(Path(p).stat().st_size for p in written),
    }


def export_llmc(
    step_dir, output, version: int = 3, merge_lora: bool = False, base: str = '', force: bool = False
) -> dict:
    """Writes the file; returns what was written, for the report. A LoRA checkpoint is
    exported merged into its base (merge_lora), never alone. An existing
    file is replaced only with `force`, and never the base the checkpoint records (export_target.py)."""
    step_dir, output = Path(step_dir), Path(output)
    state = read_trainer_state(step_dir)
    refuse_base_file(output, step_dir, state.get('llmc_file', ''), base)
    check_file_output(output, force)
    if version not in VERSIONS:
        raise CheckpointError(f'--version: expected 3 (fp32) or 5 (bf16, GPT-2 only), found {version}')
    if state.get('model_family') == 'llama3' and version != 3:
        raise CheckpointError(
            f'--version: expected 3 for LLaMA-3 (save_llama3 writes the InfiniTrain layout, fp32 only), '
            f'found {version}'
        )
    family, header, params = verified_params(step_dir, merge_lora, base)
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


def _our_step(fmt, args) -> Path:
    """The Orbax step --format llmc and hf read (an InfiniTrain step is refused, naming what it holds)."""
    if fmt.name != 'orbax':
        raise CheckpointError(
            f'{args.step_dir}: expected an Orbax checkpoint for --format {args.format}, found an '
            f'{fmt.title} one; '
            'its PR generation already holds an llm.c model.bin (export --format infinitrain-bin)'
        )
    return find_finished_step_dir(args.step_dir)


def write_hf(fmt, args) -> tuple[dict, str]:
    """`ckpt export --format hf`: (what was written, for --json; the line for people)."""
    step_dir = _our_step(fmt, args)
    written = export_hf(
        step_dir,
        args.output,
        args.merge_lora,
        args.base,
        args.force,
        args.tokenizer,
        args.dtype or 'float32',
        args.max_shard_size,
    )
    files = ', '.join(os.path.basename(f) for f in written['files'])
    line = (
        f"wrote {written['output']}: {written['model_family']} as a Hugging Face folder ({files}, "
        f"{written['dtype']}), {written['num_parameters']:,} parameters, "
        f"{human_bytes(written['size_bytes'])}; "
        f"load it with {written['hf_class']}.from_pretrained"
    )
    return {'path': str(step_dir), **written}, line


def write_llmc(fmt, args) -> tuple[dict, str]:
    """`ckpt export --format llmc`: (what was written, for --json; the lines for people)."""
    step_dir = _our_step(fmt, args)
    written = export_llmc(step_dir, args.output, args.version or 3, args.merge_lora, args.base, args.force)
    lines = [
        f"wrote {written['output']}: {written['model_family']} llm.c file, version {written['version']} "
        f"({written['dtype']}), {written['num_parameters']:,} parameters, "
        f"{human_bytes(written['size_bytes'])}; "
        f"train from it with --llmc_filepath {written['output']}"
    ]
    lines += [f'note: {note}' for note in written['notes']]
    return {'path': str(step_dir), **written}, '\n'.join(lines)
