"""LLaMA-3 model files (docs/formats.md §2): both layouts that share magic 20240803.

- LAYOUT_INFINITRAIN: one 1024-byte header whose float fields are fp32 bit patterns in int32 slots,
  then the tensors of _INFINITRAIN_TENSORS in fp32 (version 3), no biases, lm_head last. This is what
  InfiniTrain reads and what llm.c master's train_llama3.py was meant to write. save_llama3 writes it.
- LAYOUT_LLMC: llm.c's `llama3` branch: an int32 header and an fp32 header (2048 bytes), then
  GPT-2's 16-slot layout (_LLMC_TENSORS) in fp32 (3) or bf16 (5): lm_head in the wpe slot, zero
  biases (checked, then dropped), and c_fc/c_fc2 interleaved per layer in the fc slot.

The two cannot be told apart by their headers alone, so each header predicts an exact file size
and the file's size picks the layout.

llm.c master's write_model stores the float fields into an int32 tensor, truncating them
(1.4 -> 1, 1e-5 -> 0, 500000 -> 500000). Such a file is detected (its float slots hold small integers,
which read as fp32 are zero or subnormal) and can only be read when the true values are supplied
as overrides.

Tree (llmc_io/PARAMS_SPEC.md): wte/embedding (V, C), h/… stacked over L with kernels as (in, out),
ln_f/scale (C,), lm_head/kernel (C, V). No biases.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from llmc_io import header as hdr
from llmc_io.dtypes import (
    float_to_int32_bits,
)
from llmc_io.errors import LLMCFormatError
from llmc_io.tensors import (
    check_finite,
    file_to_tree,
    read_tensors,
    tree_arrays_for_writing,
    tree_set,
    tree_to_file,
    write_file,
)

from llmc_io.llama3_header import (
    _FC_PAIR,
    DEFAULT_MAJOR_MINOR,
    LAYOUT_INFINITRAIN,
    LLaMA3Header,
)
from llmc_io.llama3_info import llama3_info

# ---- loading and saving --------------------------------------------------------------------------


def load_llama3(
    path: str | os.PathLike,
    *,
    ffn_dim_multiplier: float | None = None,
    norm_eps: float | None = None,
    rope_theta: float | None = None,
    max_gen_batch_size: int | None = None,
) -> tuple[LLaMA3Header, dict]:
    """(header, params) of a LLaMA-3 file in either layout; bf16 values come back as float32.

    Use llama3_info (or llmc_io.model_info) to learn which layout was read.
    """
    info = llama3_info(
        path,
        ffn_dim_multiplier=ffn_dim_multiplier,
        norm_eps=norm_eps,
        rope_theta=rope_theta,
        max_gen_batch_size=max_gen_batch_size,
    )
    header: LLaMA3Header = info.header
    specs = header.tensor_specs(info.layout)
    tensors = read_tensors(info.path, specs, info.data_offset, info.version)
    params: dict = {}
    H = header.ffn_hidden_dim
    for spec in specs:
        values = tensors.pop(spec.name)
        if spec.tree_path is None:
            _check_zero_bias(info.path, spec.name, values)
        elif spec.tree_path == _FC_PAIR:
            tree_set(params, "h/mlp/c_fc/kernel", file_to_tree(values[:, :H], "h/mlp/c_fc/kernel"))
            tree_set(params, "h/mlp/c_fc2/kernel", file_to_tree(values[:, H:], "h/mlp/c_fc2/kernel"))
        else:
            tree_set(params, spec.tree_path, file_to_tree(values, spec.tree_path))
    return header, params


def _check_zero_bias(path: str, name: str, values: np.ndarray) -> None:
    nonzero = np.count_nonzero(values)
    if nonzero:
        raise LLMCFormatError(
            path,
            f"tensor {name} (a bias of the llm.c llama3 layout)",
            "all zeros",
            f"{nonzero} nonzero values (largest |value| {float(np.abs(values).max()):.6g})",
            "LLaMA-3 has no biases, so these trained biases cannot be kept; train with biases frozen "
            "at zero or re-export from train_llama3.py",
        )


def save_llama3(
    path: str | os.PathLike,
    header: LLaMA3Header,
    params: dict,
    *,
    major_minor: tuple[int, int] = DEFAULT_MAJOR_MINOR,
) -> str:
    """Write the InfiniTrain layout (fp32, version 3), floats bit-cast into their int32 slots.

    `major_minor` fills slots 14/15, which InfiniTrain ignores; the default 1/0 is what its removed
    SaveAsLLMC wrote. `convert` passes through the input file's pair so that it reproduces files
    exactly. Returns the file's sha256 (hex).
    """
    path = os.fspath(path)
    for field, expected, found in header.problems():
        raise LLMCFormatError(path, field, expected, found)
    scaling = (header.rope_factor, header.rope_low_freq_factor, header.rope_high_freq_factor)
    if header.use_scaled_rope and scaling + (header.rope_original_max_seq_len,) != (8.0, 1.0, 4.0, 8192):
        raise LLMCFormatError(
            path,
            "rope_scaling",
            "Llama-3.1's (factor 8, low 1, high 4, context 8192): the file's flag means those",
            scaling + (header.rope_original_max_seq_len,),
            "export this model to Hugging Face (--format hf) instead",
        )
    if header.tie_embeddings:
        # The layout has an untied head: the one tensor is written twice, as InfiniTrain writes
        # GPT-2's tied lm_head; the file loads untied.
        params = {**params, "lm_head": {"kernel": np.asarray(params["wte"]["embedding"]).T}}
        header = dataclasses.replace(header, tie_embeddings=False)
    specs = header.tensor_specs(LAYOUT_INFINITRAIN)
    arrays = tree_arrays_for_writing(path, params, header.param_shapes(), "LLaMA-3 files have no biases")
    for spec in specs:
        check_finite(path, spec, arrays[spec.tree_path])
    ints = hdr.pack_header(
        {
            0: hdr.LLAMA3_MODEL_MAGIC,
            1: 3,
            2: header.max_seq_len,
            3: header.vocab_size,
            4: header.num_layers,
            5: header.num_heads,
            6: header.num_kv_heads,
            7: header.channels,
            8: float_to_int32_bits(header.ffn_dim_multiplier),
            9: header.multiple_of,
            10: float_to_int32_bits(header.norm_eps),
            11: float_to_int32_bits(header.rope_theta),
            12: int(header.use_scaled_rope),
            13: header.max_gen_batch_size,
            14: major_minor[0],
            15: major_minor[1],
        }
    )
    return write_file(path, ints, (tree_to_file(arrays[s.tree_path], s.tree_path) for s in specs), version=3)
