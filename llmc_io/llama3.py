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
from llmc_io.header import (
    float_to_int32_bits,
    fp32_repr,
    int32_bits_to_float,
    is_fp32_subnormal_or_zero,
    round_to_fp32,
)
from llmc_io.errors import LLMCFormatError
from llmc_io.llama3_header import (
    _FC_PAIR,
    _FLOAT_FIELDS,
    _OVERRIDABLE,
    DEFAULT_MAJOR_MINOR,
    LAYOUT_INFINITRAIN,
    LAYOUT_LLMC,
    LLMC_DEFAULT_MAX_GEN_BATCH_SIZE,
    LLMC_HEADER_BYTES,
    LLaMA3Header,
)
from llmc_io.tensors import (
    VERSION_DTYPES,
    check_finite,
    file_to_tree,
    read_tensors,
    tree_arrays_for_writing,
    tree_set,
    tree_to_file,
    write_file,
)

# ---- reading the header --------------------------------------------------------------------------

# Header slot of each field in the two layouts, for error messages.
_INFINITRAIN_SLOTS = {
    "max_seq_len": 2,
    "vocab_size": 3,
    "num_layers": 4,
    "num_heads": 5,
    "num_kv_heads": 6,
    "channels": 7,
    "ffn_dim_multiplier": 8,
    "multiple_of": 9,
    "norm_eps": 10,
    "rope_theta": 11,
    "use_scaled_rope": 12,
    "max_gen_batch_size": 13,
}
_INFINITRAIN_LABELS = {name: f"header[{slot}] {name}" for name, slot in _INFINITRAIN_SLOTS.items()}
_LLMC_LABELS = {
    "max_seq_len": "int header[2]",
    "vocab_size": "int header[3]",
    "num_layers": "int header[4]",
    "num_heads": "int header[5]",
    "num_kv_heads": "int header[6]",
    "channels": "int header[7]",
    "multiple_of": "int header[8]",
    "use_scaled_rope": "int header[9]",
    "ffn_dim_multiplier": "float header[0]",
    "norm_eps": "float header[1]",
    "rope_theta": "float header[2]",
}
_LLMC_LABELS = {name: f"{label} {name}" for name, label in _LLMC_LABELS.items()}


@dataclasses.dataclass
class _Candidate:
    """One reading of the header: the header it gives, or why it gives none."""

    layout: str
    header: LLaMA3Header | None
    problem: str = ""  # why this layout does not apply, for the size error
    expected_size: int | None = None


def _infinitrain_header(ints: np.ndarray, floats: dict[str, float]) -> LLaMA3Header:
    return LLaMA3Header(
        max_seq_len=int(ints[2]),
        vocab_size=int(ints[3]),
        num_layers=int(ints[4]),
        num_heads=int(ints[5]),
        num_kv_heads=int(ints[6]),
        channels=int(ints[7]),
        ffn_dim_multiplier=floats["ffn_dim_multiplier"],
        multiple_of=int(ints[9]),
        norm_eps=floats["norm_eps"],
        rope_theta=floats["rope_theta"],
        use_scaled_rope=bool(ints[12]),
        max_gen_batch_size=int(ints[13]),
    )


def _candidate(
    layout: str, header: LLaMA3Header, version: int, scaled_rope_slot: int, labels: dict[str, str]
) -> _Candidate:
    problems = header.problems()
    if scaled_rope_slot not in (0, 1):
        problems.insert(0, ("use_scaled_rope", "0 or 1", str(scaled_rope_slot)))
    if problems:
        field, expected, found = problems[0]
        return _Candidate(layout, None, f"{labels.get(field, field)}: expected {expected}, found {found}")
    return _Candidate(layout, header, expected_size=header.file_size(layout, version))


def _truncated_floats(ints: np.ndarray) -> bool:
    """Whether the 1 KB layout's float slots hold integers rather than fp32 bit patterns.

    norm_eps and rope_theta can never be 0 or subnormal; ffn_dim_multiplier may be exactly 0.0
    ("none"), but a nonzero subnormal there is an integer such as int(1.4) = 1.
    """
    return (
        is_fp32_subnormal_or_zero(ints[10])
        or is_fp32_subnormal_or_zero(ints[11])
        or (ints[8] != 0 and is_fp32_subnormal_or_zero(ints[8]))
    )


def _apply_overrides(
    path: str, header: LLaMA3Header, stored: tuple[str, ...], overrides: dict
) -> LLaMA3Header:
    """Fill fields the file lacks from `overrides`; an override of a stored value must agree with it.

    Silently replacing a value the file does hold would train a different model than the file's.
    """
    for name, value in overrides.items():
        if name in stored:
            is_float = name in _FLOAT_FIELDS
            held = getattr(header, name)
            if (round_to_fp32(float(value)) if is_float else int(value)) != held:
                shown = fp32_repr(held) if is_float else held
                raise LLMCFormatError(
                    path,
                    name,
                    f"the file's value {shown}",
                    f"override {value!r}",
                    "overrides only fill values the file lacks or truncated; drop the override",
                )
    return dataclasses.replace(header, **{k: v for k, v in overrides.items() if k not in stored})


def llama3_info(
    path: str | os.PathLike,
    *,
    ffn_dim_multiplier: float | None = None,
    norm_eps: float | None = None,
    rope_theta: float | None = None,
    max_gen_batch_size: int | None = None,
) -> hdr.ModelInfo:
    """Read a LLaMA-3 model file's header(s), pick the layout by file size, and check both.

    Overrides (None = not given) supply what the file does not hold: the true floats of a file whose
    floats llm.c master truncated, and max_gen_batch_size for the llm.c layout.
    """
    path = os.fspath(path)
    given = {
        "ffn_dim_multiplier": ffn_dim_multiplier,
        "norm_eps": norm_eps,
        "rope_theta": rope_theta,
        "max_gen_batch_size": max_gen_batch_size,
    }
    overrides = {name: value for name, value in given.items() if value is not None}
    ints = hdr.read_header(path)
    hint = ""
    if int(ints[0]) == hdr.GPT2_MODEL_MAGIC:
        hint = (
            "this is a GPT-2 model file; use load_gpt2 or load_model (to train it: --config=configs/gpt2.py)"
        )
    hdr.check_magic(path, ints, hdr.LLAMA3_MODEL_MAGIC, hint)
    version = int(ints[1])
    if version not in VERSION_DTYPES:
        raise LLMCFormatError(path, "header[1] version", "3 (fp32) or 5 (bf16)", str(version))
    dtype_name = VERSION_DTYPES[version][0]
    actual_size = hdr.file_size(path)

    # Reading 1: llm.c's llama3 branch (int header + float header).
    if actual_size >= LLMC_HEADER_BYTES:
        floats = np.fromfile(path, dtype="<f4", count=3, offset=hdr.HEADER_BYTES)
        llmc_header = LLaMA3Header(
            max_seq_len=int(ints[2]),
            vocab_size=int(ints[3]),
            num_layers=int(ints[4]),
            num_heads=int(ints[5]),
            num_kv_heads=int(ints[6]),
            channels=int(ints[7]),
            ffn_dim_multiplier=float(floats[0]),
            multiple_of=int(ints[8]),
            norm_eps=float(floats[1]),
            rope_theta=float(floats[2]),
            use_scaled_rope=bool(ints[9]),
            max_gen_batch_size=LLMC_DEFAULT_MAX_GEN_BATCH_SIZE,
        )
        llmc = _candidate(LAYOUT_LLMC, llmc_header, version, int(ints[9]), _LLMC_LABELS)
    else:
        llmc = _Candidate(LAYOUT_LLMC, None, f"shorter than its {LLMC_HEADER_BYTES}-byte header")

    # Reading 2: InfiniTrain (one header, floats as bit patterns).
    truncated = _truncated_floats(ints)
    infinitrain = _Candidate(LAYOUT_INFINITRAIN, None, "float slots hold truncated integers")
    if not truncated:
        floats = {name: int32_bits_to_float(ints[_INFINITRAIN_SLOTS[name]]) for name in _FLOAT_FIELDS}
        infinitrain = _candidate(
            LAYOUT_INFINITRAIN, _infinitrain_header(ints, floats), version, int(ints[12]), _INFINITRAIN_LABELS
        )

    notes: list[str] = []
    if llmc.expected_size == actual_size:
        chosen = llmc
        header = _apply_overrides(path, llmc.header, _FLOAT_FIELDS, overrides)
        major_minor = (int(ints[10]), int(ints[11]))
        notes.append(
            "llm.c llama3-branch layout: zero biases are dropped; max_gen_batch_size is not "
            f"stored ({header.max_gen_batch_size} used)"
        )
    elif infinitrain.expected_size == actual_size:
        chosen = infinitrain
        header = _apply_overrides(path, infinitrain.header, _OVERRIDABLE, overrides)
        major_minor = (int(ints[14]), int(ints[15]))
    elif truncated and llmc.header is None:
        chosen, header = _truncated_candidate(path, ints, version, actual_size, overrides)
        major_minor = (int(ints[14]), int(ints[15]))
        notes.append(
            "float slots were truncated to integers by llm.c master's train_llama3.py; "
            "used " + ", ".join(f"{k}={fp32_repr(getattr(header, k))}" for k in _FLOAT_FIELDS)
        )
    else:
        options = [
            f"{c.expected_size:,} bytes ({c.layout} layout)"
            if c.header is not None
            else f"no size for the {c.layout} layout ({c.problem})"
            for c in (infinitrain, llmc)
        ]
        hint = "the file is truncated, has trailing data, or its header is wrong"
        if truncated:
            hint += (
                "; if llm.c master's train_llama3.py wrote it, its floats were truncated to int: "
                "pass the true ffn_dim_multiplier and norm_eps"
            )
        raise LLMCFormatError(path, "file size", " or ".join(options), f"{actual_size:,}", hint)
    if chosen.layout == LAYOUT_INFINITRAIN and version == 5:
        notes.append(
            "bf16 in the 1 KB layout is llm.c master's bf16 export; InfiniTrain reads only "
            "version 3 (convert writes it)"
        )
    data_offset = hdr.HEADER_BYTES if chosen.layout == LAYOUT_INFINITRAIN else LLMC_HEADER_BYTES
    return hdr.ModelInfo(
        path=path,
        kind="llama3",
        layout=chosen.layout,
        version=version,
        dtype=dtype_name,
        header=header,
        data_offset=data_offset,
        num_stored_values=header.num_stored_values(chosen.layout),
        expected_size=header.file_size(chosen.layout, version),
        actual_size=actual_size,
        major_minor=major_minor,
        notes=tuple(notes),
    )


def _truncated_candidate(
    path: str, ints: np.ndarray, version: int, actual_size: int, overrides: dict
) -> tuple[_Candidate, LLaMA3Header]:
    """The header of a 1 KB-layout file whose float slots llm.c master truncated, from overrides."""
    missing = [name for name in ("ffn_dim_multiplier", "norm_eps") if name not in overrides]
    if missing:
        found = ", ".join(f"{name}={int(ints[_INFINITRAIN_SLOTS[name]])}" for name in _FLOAT_FIELDS)
        raise LLMCFormatError(
            path,
            "header[8,10,11] float fields",
            "fp32 bit patterns (1.4f = 0x3FB33333, 1e-5f = 0x3727C5AC)",
            f"integers {found}",
            "llm.c master's train_llama3.py truncated the floats to int; supply the true values, e.g. "
            "--config.llmc_ffn_dim_multiplier=1.4 --config.llmc_norm_eps=1e-5 (3.2-1B; 3.1-8B: 1.3), "
            "load_llama3(path, ffn_dim_multiplier=..., norm_eps=...), or repair the file with "
            "python -m llmc_io convert IN OUT --ffn-dim-multiplier 1.4 --norm-eps 1e-5",
        )
    # rope_theta survives truncation when it is an integer (500000), so the int is its value.
    floats = {"rope_theta": float(int(ints[11]))}
    floats.update({name: overrides[name] for name in _FLOAT_FIELDS if name in overrides})
    header = _infinitrain_header(ints, floats)
    if "max_gen_batch_size" in overrides:
        header = _apply_overrides(path, header, ("max_gen_batch_size",), overrides)
    for field, expected, found in header.problems():
        raise LLMCFormatError(path, _INFINITRAIN_LABELS.get(field, field), expected, found)
    expected_size = header.file_size(LAYOUT_INFINITRAIN, version)
    if expected_size != actual_size:
        # Every size but the MLP's is fixed by the integer slots, so the file size says what hidden
        # dim the truncated multiplier really gave: a concrete check on the override.
        itemsize = VERSION_DTYPES[version][1].itemsize
        per_hidden = 3 * header.num_layers * header.channels * itemsize
        mlp_bytes = actual_size - (expected_size - header.ffn_hidden_dim * per_hidden)
        implied = "no ffn hidden dim fits the file size"
        if mlp_bytes > 0 and mlp_bytes % per_hidden == 0:
            implied = f"the file size implies ffn hidden {mlp_bytes // per_hidden}"
        raise LLMCFormatError(
            path,
            "file size",
            f"{expected_size:,} bytes (infinitrain layout with "
            f"ffn_dim_multiplier={fp32_repr(header.ffn_dim_multiplier)}: ffn hidden "
            f"{header.ffn_hidden_dim})",
            f"{actual_size:,}",
            f"{implied}; check the ffn_dim_multiplier override",
        )
    return _Candidate(LAYOUT_INFINITRAIN, header, expected_size=expected_size), header


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
