"""GPT-2 model files of llm.c (docs/formats.md §1): version 3 (fp32) and 5 (bf16), read and written.

File: a 1024-byte int32 header, then the 16 tensors of _TENSORS, stacked over layers, no padding.
Tree: nested dicts of float32 arrays laid out as llmc_io/PARAMS_SPEC.md says. There is no lm_head: the output
projection is tied to `wte/embedding` (Vp, C), a single array. Its rows V..Vp-1 are llm.c's vocabulary
padding; they are returned as read and always written as zeros (their gradient is zero in llm.c,
so a trained llm.c file has zeros there too, and writing zeros keeps the file loss-equivalent).
InfiniTrain's SaveAsLLMC files have no padding (Vp == V) and are read the same way.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from llmc_io import header as hdr
from llmc_io.errors import LLMCFormatError
from llmc_io.tensors import (
    VERSION_DTYPES,
    check_finite,
    file_to_tree,
    read_tensors,
    resolve,
    tree_arrays_for_writing,
    tree_set,
    tree_to_file,
    write_file,
)

LAYOUT = "llmc-gpt2"

# llm.c name, tree path (llmc_io/PARAMS_SPEC.md), shape in the file. Symbols: Vp padded vocab, T max_seq_len,
# L layers, C channels. The order is the byte order of the file.
_TENSORS = (
    ("wte", "wte/embedding", ("Vp", "C")),
    ("wpe", "wpe/embedding", ("T", "C")),
    ("ln1w", "h/ln_1/scale", ("L", "C")),
    ("ln1b", "h/ln_1/bias", ("L", "C")),
    ("qkvw", "h/attn/c_attn/kernel", ("L", "3C", "C")),  # rows: Q [0,C), K [C,2C), V [2C,3C)
    ("qkvb", "h/attn/c_attn/bias", ("L", "3C")),
    ("attprojw", "h/attn/c_proj/kernel", ("L", "C", "C")),
    ("attprojb", "h/attn/c_proj/bias", ("L", "C")),
    ("ln2w", "h/ln_2/scale", ("L", "C")),
    ("ln2b", "h/ln_2/bias", ("L", "C")),
    ("fcw", "h/mlp/c_fc/kernel", ("L", "4C", "C")),
    ("fcb", "h/mlp/c_fc/bias", ("L", "4C")),
    ("fcprojw", "h/mlp/c_proj/kernel", ("L", "C", "4C")),
    ("fcprojb", "h/mlp/c_proj/bias", ("L", "C")),
    ("lnfw", "ln_f/scale", ("C",)),
    ("lnfb", "ln_f/bias", ("C",)),
)

_VERSION_HINTS = {
    1: "versions 1 and 2 predate vocabulary padding; re-export the model with current llm.c train_gpt2.py",
    2: "versions 1 and 2 predate vocabulary padding; re-export the model with current llm.c train_gpt2.py",
    4: "version 4 (mixed bf16) is no longer written or read by llm.c; re-export as version 3 or 5",
}


@dataclasses.dataclass(frozen=True)
class GPT2Header:
    """The model shape a GPT-2 file header holds (slots 2..7)."""

    max_seq_len: int  # slot 2, maxT (block size)
    vocab_size: int  # slot 3, V
    padded_vocab_size: int  # slot 7, Vp >= V (llm.c: V rounded up to a multiple of 128)
    num_layers: int  # slot 4, L
    num_heads: int  # slot 5, NH
    channels: int  # slot 6, C

    @property
    def num_parameters(self) -> int:
        """N = Vp*C + maxT*C + L*(12C^2 + 13C) + 2C, padding rows included (as stored)."""
        C, L = self.channels, self.num_layers
        return self.padded_vocab_size * C + self.max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C

    def file_size(self, version: int = 3) -> int:
        return hdr.HEADER_BYTES + self.num_parameters * VERSION_DTYPES[version][1].itemsize

    def problems(self) -> list[tuple[str, str, str]]:
        """(field, expected, found) for every inconsistency; empty when the header is usable."""
        found = []
        for slot, name in (
            (2, "max_seq_len"),
            (3, "vocab_size"),
            (4, "num_layers"),
            (5, "num_heads"),
            (6, "channels"),
            (7, "padded_vocab_size"),
        ):
            value = getattr(self, name)
            if not 0 < value < 2**31:
                found.append((f"header[{slot}] {name}", "a positive int32", str(value)))
        if found:
            return found
        if self.vocab_size > self.padded_vocab_size:
            found.append(
                (
                    "header[7] padded_vocab_size",
                    f">= vocab_size ({self.vocab_size})",
                    str(self.padded_vocab_size),
                )
            )
        if self.channels % self.num_heads:
            found.append(
                ("header[6] channels", f"a multiple of num_heads ({self.num_heads})", str(self.channels))
            )
        return found

    def tensor_specs(self):
        C = self.channels
        dims = {
            "Vp": self.padded_vocab_size,
            "T": self.max_seq_len,
            "L": self.num_layers,
            "C": C,
            "3C": 3 * C,
            "4C": 4 * C,
        }
        return resolve(_TENSORS, dims)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """{tree path: shape} of the parameter tree for this header (llmc_io/PARAMS_SPEC.md)."""
        return {spec.tree_path: spec.tree_shape for spec in self.tensor_specs()}


def gpt2_info(path: str | os.PathLike) -> hdr.ModelInfo:
    """Read and check the header of a GPT-2 model file against the file's size (reads no tensors)."""
    path = os.fspath(path)
    ints = hdr.read_header(path)
    hint = ""
    if int(ints[0]) == hdr.LLAMA3_MODEL_MAGIC:
        hint = (
            "this is a LLaMA-3 model file; use load_llama3 or load_model "
            "(to train it: --config=configs/llama3.py)"
        )
    hdr.check_magic(path, ints, hdr.GPT2_MODEL_MAGIC, hint)
    version = int(ints[1])
    if version not in VERSION_DTYPES:
        raise LLMCFormatError(
            path,
            "header[1] version",
            "3 (fp32) or 5 (bf16)",
            str(version),
            _VERSION_HINTS.get(version, "not a version llm.c ever wrote"),
        )
    header = GPT2Header(
        max_seq_len=int(ints[2]),
        vocab_size=int(ints[3]),
        padded_vocab_size=int(ints[7]),
        num_layers=int(ints[4]),
        num_heads=int(ints[5]),
        channels=int(ints[6]),
    )
    for field, expected, found in header.problems():
        raise LLMCFormatError(path, field, expected, found)
    dtype_name = VERSION_DTYPES[version][0]
    expected_size = header.file_size(version)
    actual_size = hdr.file_size(path)
    hdr.check_exact_size(
        path, expected_size, actual_size, f"1024-byte header + {header.num_parameters:,} {dtype_name} values"
    )
    notes = ()
    if header.padded_vocab_size == header.vocab_size:
        notes = ("no vocabulary padding (Vp == V), as InfiniTrain's SaveAsLLMC writes",)
    return hdr.ModelInfo(
        path=path,
        kind="gpt2",
        layout=LAYOUT,
        version=version,
        dtype=dtype_name,
        header=header,
        data_offset=hdr.HEADER_BYTES,
        num_stored_values=header.num_parameters,
        expected_size=expected_size,
        actual_size=actual_size,
        notes=notes,
    )


def load_gpt2(path: str | os.PathLike) -> tuple[GPT2Header, dict]:
    """(header, params) of an llm.c GPT-2 file, version 3 or 5; bf16 values come back as float32."""
    info = gpt2_info(path)
    specs = info.header.tensor_specs()
    tensors = read_tensors(info.path, specs, info.data_offset, info.version)
    params: dict = {}
    for spec in specs:
        tree_set(params, spec.tree_path, file_to_tree(tensors.pop(spec.name), spec.tree_path))
    return info.header, params


def save_gpt2(path: str | os.PathLike, header: GPT2Header, params: dict, version: int = 3) -> str:
    """Write an llm.c GPT-2 file: version 3 (fp32) or 5 (bf16, rounded to nearest even).

    Rows V..Vp-1 of wte are written as zeros, whatever the tree holds. Returns the file's sha256 (hex).
    """
    path = os.fspath(path)
    if version not in VERSION_DTYPES:
        raise LLMCFormatError(
            path, "version", "3 (fp32) or 5 (bf16)", str(version), _VERSION_HINTS.get(version)
        )
    for field, expected, found in header.problems():
        raise LLMCFormatError(path, field, expected, found)
    specs = header.tensor_specs()
    arrays = tree_arrays_for_writing(
        path, params, header.param_shapes(), "GPT-2 files have no lm_head: the head is tied to wte/embedding"
    )
    # Refuse to write what load_gpt2 would refuse to read.
    for spec in specs:
        check_finite(path, spec, arrays[spec.tree_path])

    def file_arrays():
        for spec in specs:
            array = tree_to_file(arrays[spec.tree_path], spec.tree_path)
            if spec.name == "wte":
                V = header.vocab_size
                yield array[:V]
                yield np.zeros((header.padded_vocab_size - V, header.channels), np.float32)
            else:
                yield array

    ints = hdr.pack_header(
        {
            0: hdr.GPT2_MODEL_MAGIC,
            1: version,
            2: header.max_seq_len,
            3: header.vocab_size,
            4: header.num_layers,
            5: header.num_heads,
            6: header.channels,
            7: header.padded_vocab_size,
        }
    )
    return write_file(path, ints, file_arrays(), version)
