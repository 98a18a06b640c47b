"""GPT-2 model files: hand-built files with known bytes -> the PARAMS_SPEC tree, and back.

Files here are written directly from the docs/formats.md §1 layout with NumPy (never with llmc_io's
writer), so reading them checks the reader against the spec, and comparing the writer's bytes with
them checks the writer against the spec.
"""

import os
from pathlib import Path

import numpy as np
import pytest

import llmc_io
from llmc_io import GPT2Header, LLMCFormatError, load_gpt2, save_gpt2

GPT2_MAGIC = 20240326
TINY = {"maxT": 4, "V": 10, "Vp": 16, "L": 2, "NH": 2, "C": 8}

# llmc_io/PARAMS_SPEC.md's GPT-2 tree, written out for TINY (C=8, L=2, Vp=16, maxT=4).
TINY_TREE_SHAPES = {
    "wte/embedding": (16, 8),
    "wpe/embedding": (4, 8),
    "h/ln_1/scale": (2, 8),
    "h/ln_1/bias": (2, 8),
    "h/attn/c_attn/kernel": (2, 8, 24),
    "h/attn/c_attn/bias": (2, 24),
    "h/attn/c_proj/kernel": (2, 8, 8),
    "h/attn/c_proj/bias": (2, 8),
    "h/ln_2/scale": (2, 8),
    "h/ln_2/bias": (2, 8),
    "h/mlp/c_fc/kernel": (2, 8, 32),
    "h/mlp/c_fc/bias": (2, 32),
    "h/mlp/c_proj/kernel": (2, 32, 8),
    "h/mlp/c_proj/bias": (2, 8),
    "ln_f/scale": (8,),
    "ln_f/bias": (8,),
}


def gpt2_file_tensors(maxT, V, Vp, L, NH, C, seed=0, bf16_exact=False):
    """docs/formats.md §1's 16 tensors in file order and (out, in) orientation; wte padding rows zero.

    bf16_exact: zero the low 16 bits so every value is exactly a bf16 (then a v5 file's expected
    fp32 values need no rounding reference).
    """
    rng = np.random.default_rng(seed)
    shapes = [
        ("wte", (Vp, C)),
        ("wpe", (maxT, C)),
        ("ln1w", (L, C)),
        ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)),
        ("qkvb", (L, 3 * C)),
        ("attprojw", (L, C, C)),
        ("attprojb", (L, C)),
        ("ln2w", (L, C)),
        ("ln2b", (L, C)),
        ("fcw", (L, 4 * C, C)),
        ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)),
        ("fcprojb", (L, C)),
        ("lnfw", (C,)),
        ("lnfb", (C,)),
    ]
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes}
    tensors["wte"][V:] = 0
    if bf16_exact:
        for name, t in tensors.items():
            tensors[name] = (t.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    return tensors


def gpt2_header_bytes(version, maxT, V, Vp, L, NH, C, magic=GPT2_MAGIC):
    header = np.zeros(256, "<i4")
    header[:8] = [magic, version, maxT, V, L, NH, C, Vp]
    return header.tobytes()


def write_gpt2_file(path, tensors, version=3, magic=GPT2_MAGIC, **dims):
    """Header + tensors in dict order; version 5 stores the top 16 bits (values must be bf16-exact)."""
    with open(path, "wb") as f:
        f.write(gpt2_header_bytes(version, magic=magic, **dims))
        for t in tensors.values():
            if version == 5:
                f.write((t.view(np.uint32) >> 16).astype("<u2").tobytes())
            else:
                f.write(t.astype("<f4").tobytes())
    return str(path)


def tiny_file(tmp_path, name="model.bin", version=3, seed=0, **changes):
    dims = {**TINY, **changes}
    tensors = gpt2_file_tensors(**dims, seed=seed, bf16_exact=version == 5)
    return write_gpt2_file(tmp_path / name, tensors, version=version, **dims), tensors


def leaves(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ---- reading to the spec tree --------------------------------------------------------------------


def test_hand_built_v3_file_reads_to_the_spec_tree(tmp_path):
    path, t = tiny_file(tmp_path)
    header, params = load_gpt2(path)
    assert header == GPT2Header(
        max_seq_len=4, vocab_size=10, padded_vocab_size=16, num_layers=2, num_heads=2, channels=8
    )
    flat = leaves(params)
    assert {k: v.shape for k, v in flat.items()} == TINY_TREE_SHAPES
    for value in flat.values():
        assert type(value) is np.ndarray and value.dtype == np.float32 and value.flags.c_contiguous
        assert value.flags.writeable  # a copy, not a view of the file

    C = 8
    np.testing.assert_array_equal(params["wte"]["embedding"], t["wte"])
    np.testing.assert_array_equal(params["wpe"]["embedding"], t["wpe"])
    kernel = params["h"]["attn"]["c_attn"]["kernel"]
    for layer in range(2):
        # Columns [0,C) are Q, [C,2C) K, [2C,3C) V: each block is the transpose of its rows in the file.
        np.testing.assert_array_equal(kernel[layer][:, 0:C], t["qkvw"][layer][0:C].T)
        np.testing.assert_array_equal(kernel[layer][:, C : 2 * C], t["qkvw"][layer][C : 2 * C].T)
        np.testing.assert_array_equal(kernel[layer][:, 2 * C :], t["qkvw"][layer][2 * C :].T)
        np.testing.assert_array_equal(params["h"]["attn"]["c_proj"]["kernel"][layer], t["attprojw"][layer].T)
        np.testing.assert_array_equal(params["h"]["mlp"]["c_fc"]["kernel"][layer], t["fcw"][layer].T)
        np.testing.assert_array_equal(params["h"]["mlp"]["c_proj"]["kernel"][layer], t["fcprojw"][layer].T)
    for path_in_tree, name in [
        ("h/ln_1/scale", "ln1w"),
        ("h/ln_1/bias", "ln1b"),
        ("h/attn/c_attn/bias", "qkvb"),
        ("h/attn/c_proj/bias", "attprojb"),
        ("h/ln_2/scale", "ln2w"),
        ("h/ln_2/bias", "ln2b"),
        ("h/mlp/c_fc/bias", "fcb"),
        ("h/mlp/c_proj/bias", "fcprojb"),
        ("ln_f/scale", "lnfw"),
        ("ln_f/bias", "lnfb"),
    ]:
        np.testing.assert_array_equal(flat[path_in_tree], t[name])


def test_one_value_found_at_its_byte_offset(tmp_path):
    """Layer 1, K row 3 (head 1's first K row, hs=4), input column 5, located by hand from §1."""
    path, _ = tiny_file(tmp_path)
    Vp, maxT, L, C = 16, 4, 2, 8
    qkvw_start = 1024 + 4 * (Vp * C + maxT * C + 2 * L * C)  # after wte, wpe, ln1w, ln1b
    row, col = C + 3, 5
    offset = qkvw_start + 4 * (1 * 3 * C * C + row * C + col)
    with open(path, "rb") as f:
        f.seek(offset)
        value = np.frombuffer(f.read(4), "<f4")[0]
    _, params = load_gpt2(path)
    assert params["h"]["attn"]["c_attn"]["kernel"][1, col, row] == value


def test_head_is_wte_and_there_is_no_lm_head(tmp_path):
    path, _ = tiny_file(tmp_path)
    _, params = load_gpt2(path)
    assert set(params) == {"wte", "wpe", "h", "ln_f"}
    assert set(params["wte"]) == {"embedding"}
    assert isinstance(params["wte"]["embedding"], np.ndarray)
    assert not any("lm_head" in key for key in leaves(params))


def test_bf16_v5_file_reads_as_float32(tmp_path):
    path, t = tiny_file(tmp_path, version=5)
    header, params = load_gpt2(path)
    assert os.path.getsize(path) == header.file_size(5) == 1024 + 2 * header.num_parameters
    np.testing.assert_array_equal(params["h"]["attn"]["c_attn"]["kernel"][1], t["qkvw"][1].T)
    np.testing.assert_array_equal(params["ln_f"]["bias"], t["lnfb"])
    assert params["wte"]["embedding"].dtype == np.float32


def test_padding_rows_are_kept_as_read_and_written_as_zeros(tmp_path):
    dims = dict(TINY)
    t = gpt2_file_tensors(**dims)
    t["wte"][10:] = 7.0  # a file with nonzero padding rows
    path = write_gpt2_file(tmp_path / "padded.bin", t, **dims)
    header, params = load_gpt2(path)
    assert (params["wte"]["embedding"][10:] == 7.0).all()
    save_gpt2(tmp_path / "out.bin", header, params)
    t["wte"][10:] = 0.0
    expected = write_gpt2_file(tmp_path / "expected.bin", t, **dims)
    assert (tmp_path / "out.bin").read_bytes() == Path(expected).read_bytes()


def test_unpadded_infinitrain_file_reads(tmp_path):
    """InfiniTrain's SaveAsLLMC wrote Vp == V (no padding rows)."""
    path, t = tiny_file(tmp_path, Vp=10)
    header, params = load_gpt2(path)
    assert header.padded_vocab_size == header.vocab_size == 10
    np.testing.assert_array_equal(params["wte"]["embedding"], t["wte"])
    assert any("Vp == V" in note for note in llmc_io.model_info(path).notes)
    save_gpt2(tmp_path / "out.bin", header, params)
    assert (tmp_path / "out.bin").read_bytes() == Path(path).read_bytes()


# ---- writing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 5])
def test_write_read_write_is_byte_identical(tmp_path, version):
    path, _ = tiny_file(tmp_path, version=version)
    header, params = load_gpt2(path)
    save_gpt2(tmp_path / "a.bin", header, params, version=version)
    assert (tmp_path / "a.bin").read_bytes() == Path(path).read_bytes()  # the writer matches the spec
    save_gpt2(tmp_path / "b.bin", *load_gpt2(tmp_path / "a.bin"), version=version)
    assert (tmp_path / "b.bin").read_bytes() == (tmp_path / "a.bin").read_bytes()


def test_fp32_to_bf16_rounds_like_an_independent_implementation(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    path, t = tiny_file(tmp_path)  # arbitrary fp32 values, most not bf16-exact
    save_gpt2(tmp_path / "bf16.bin", *load_gpt2(path), version=5)
    expected = gpt2_header_bytes(5, **TINY) + b"".join(
        v.astype(ml_dtypes.bfloat16).view("<u2").tobytes() for v in t.values()
    )
    assert (tmp_path / "bf16.bin").read_bytes() == expected


def test_writer_accepts_other_array_types_and_dtypes(tmp_path):
    path, _ = tiny_file(tmp_path)
    header, params = load_gpt2(path)
    mixed = dict(params)
    mixed["wpe"] = {"embedding": params["wpe"]["embedding"].tolist()}
    mixed["ln_f"] = {k: v.astype(np.float64) for k, v in params["ln_f"].items()}
    save_gpt2(tmp_path / "out.bin", header, mixed)
    assert (tmp_path / "out.bin").read_bytes() == Path(path).read_bytes()


def test_writer_leaves_no_partial_file_on_error(tmp_path):
    path, _ = tiny_file(tmp_path)
    header, params = load_gpt2(path)
    params["h"]["ln_2"]["bias"][1, 3] = np.nan
    with pytest.raises(
        LLMCFormatError, match=r"ln2b .*h/ln_2/bias.*1 NaN and 0 inf, the first at index \(1, 3\)"
    ):
        save_gpt2(tmp_path / "out.bin", header, params)
    assert os.listdir(tmp_path) == ["model.bin"]


def test_writer_rejects_trees_that_do_not_fit(tmp_path):
    path, _ = tiny_file(tmp_path)
    header, params = load_gpt2(path)
    out = tmp_path / "out.bin"
    with_head = {**params, "lm_head": {"kernel": np.zeros((8, 16), np.float32)}}
    with pytest.raises(LLMCFormatError, match=r"params\[lm_head/kernel\].*tied to wte/embedding"):
        save_gpt2(out, header, with_head)
    llmc_oriented = {
        **params,
        "h": {
            **params["h"],
            "attn": {
                **params["h"]["attn"],
                "c_attn": {
                    "kernel": np.zeros((2, 24, 8), np.float32),
                    "bias": params["h"]["attn"]["c_attn"]["bias"],
                },
            },
        },
    }
    with pytest.raises(
        LLMCFormatError,
        match=r"c_attn/kernel\]: expected shape \(2, 8, 24\), found shape "
        r"\(2, 24, 8\); kernels are \(in, out\)",
    ):
        save_gpt2(out, header, llmc_oriented)
    without_wpe = {k: v for k, v in params.items() if k != "wpe"}
    with pytest.raises(LLMCFormatError, match=r"params\[wpe/embedding\]: expected an array, found nothing"):
        save_gpt2(out, header, without_wpe)
    with pytest.raises(LLMCFormatError, match="version: expected 3 .fp32. or 5 .bf16., found 4"):
        save_gpt2(out, header, params, version=4)
    assert not out.exists()


# ---- docs/formats.md numbers ----------------------------------------------------------------------------


def test_124m_numbers_from_formats():
    header = GPT2Header(
        max_seq_len=1024, vocab_size=50257, padded_vocab_size=50304, num_layers=12, num_heads=12, channels=768
    )
    assert header.num_parameters == 124_475_904
    assert header.file_size(3) == 497_904_640
    assert header.file_size(5) == 248_952_832
    unpadded = GPT2Header(1024, 50257, 50257, 12, 12, 768)
    assert unpadded.num_parameters == 124_439_808
    assert header.file_size(3) - unpadded.file_size(3) == 144_384  # 47 padding rows * 768 * 4 B
    offsets, offset = {}, 1024
    for spec in header.tensor_specs():
        offsets[spec.name] = offset
        offset += 4 * spec.size
    assert offset == 497_904_640
    assert {k: offsets[k] for k in ("wte", "wpe", "qkvw", "fcw", "fcprojw", "lnfw")} == {
        "wte": 1024,
        "wpe": 154_534_912,
        "qkvw": 157_754_368,
        "fcw": 271_221_760,
        "fcprojw": 384_615_424,
        "lnfw": 497_898_496,
    }


@pytest.mark.parametrize(
    "layers, channels, heads, expected",
    [(24, 1024, 16, 354_871_296), (36, 1280, 20, 774_090_240), (48, 1600, 25, 1_557_686_400)],
)
def test_larger_gpt2_parameter_counts(layers, channels, heads, expected):
    assert GPT2Header(1024, 50257, 50304, layers, heads, channels).num_parameters == expected


# ---- bad input ---------------------------------------------------------------------------------------


def _rewrite_header(path, **slots):
    data = bytearray(Path(path).read_bytes())
    header = np.frombuffer(bytes(data[:1024]), "<i4").copy()
    for slot, value in slots.items():
        header[int(slot[1:])] = value
    data[:1024] = header.tobytes()
    Path(path).write_bytes(bytes(data))


def _error(path, loader=load_gpt2):
    with pytest.raises(LLMCFormatError) as info:
        loader(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def test_wrong_magic(tmp_path):
    path, _ = tiny_file(tmp_path)
    _rewrite_header(path, s0=12345)
    assert (
        ": header[0] magic: expected 20240326 (GPT-2 model file), found 12345 (not an llm.c magic)"
        in _error(path)
    )


def test_llama3_file_given_to_load_gpt2(tmp_path):
    path, _ = tiny_file(tmp_path)
    _rewrite_header(path, s0=20240803)
    message = _error(path)
    assert "found 20240803 (LLaMA-3 model file)" in message and "use load_llama3" in message


@pytest.mark.parametrize(
    "version, hint",
    [
        (1, "predate vocabulary padding"),
        (2, "predate vocabulary padding"),
        (4, "mixed bf16"),
        (6, "not a version llm.c ever wrote"),
    ],
)
def test_rejected_versions(tmp_path, version, hint):
    path, _ = tiny_file(tmp_path)
    _rewrite_header(path, s1=version)
    message = _error(path)
    assert f"header[1] version: expected 3 (fp32) or 5 (bf16), found {version}" in message and hint in message


def test_truncated_file(tmp_path):
    path, _ = tiny_file(tmp_path)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 4)
    message = _error(path)
    assert f"file size: expected {size:,} bytes" in message and f"found {size - 4:,}" in message
    assert "4 bytes short" in message


def test_file_shorter_than_its_header(tmp_path):
    path = tmp_path / "stub.bin"
    path.write_bytes(b"\0" * 100)
    assert "file size: expected at least 1,024 bytes (the header), found 100" in _error(str(path))


def test_size_disagreeing_with_header(tmp_path):
    path, _ = tiny_file(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\0" * 8)
    assert "8 bytes more than the header accounts for" in _error(path)
    path2, _ = tiny_file(tmp_path, name="m2.bin")
    _rewrite_header(path2, s4=3)  # L=3 but the tensors are for L=2
    assert "bytes short" in _error(path2)


def test_vocab_larger_than_padded_vocab(tmp_path):
    path, _ = tiny_file(tmp_path)
    _rewrite_header(path, s3=17)
    assert "header[7] padded_vocab_size: expected >= vocab_size (17), found 16" in _error(path)


def test_channels_not_divisible_by_heads(tmp_path):
    path, _ = tiny_file(tmp_path)
    _rewrite_header(path, s5=3)
    assert "header[6] channels: expected a multiple of num_heads (3), found 8" in _error(path)


def test_non_finite_weights_name_the_tensor(tmp_path):
    dims = dict(TINY)
    t = gpt2_file_tensors(**dims)
    t["qkvw"][1, 2, 3] = np.nan
    path = write_gpt2_file(tmp_path / "nan.bin", t, **dims)
    message = _error(path)
    assert (
        "tensor qkvw (h/attn/c_attn/kernel): expected finite values, found 1 NaN and 0 inf, "
        "the first at index (1, 2, 3)" in message
    )
    t = gpt2_file_tensors(**dims, bf16_exact=True)
    t["fcw"][0, 0, 1] = -np.inf
    path = write_gpt2_file(tmp_path / "inf.bin", t, version=5, **dims)
    assert "tensor fcw (h/mlp/c_fc/kernel): expected finite values, found 0 NaN and 1 inf" in _error(path)


def test_missing_file(tmp_path):
    assert "file: expected an existing file, found nothing at that path" in _error(str(tmp_path / "nope.bin"))


def test_load_model_dispatches_to_gpt2(tmp_path):
    path, _ = tiny_file(tmp_path)
    header, params = llmc_io.load_model(path)
    assert isinstance(header, GPT2Header) and "wpe" in params
    info = llmc_io.model_info(path)
    assert (info.kind, info.layout, info.version, info.dtype) == ("gpt2", "llmc-gpt2", 3, "float32")
    assert info.expected_size == info.actual_size == os.path.getsize(path)
    with pytest.raises(LLMCFormatError, match="overrides: expected none for a GPT-2 model file"):
        llmc_io.load_model(path, norm_eps=1e-5)
    # None-valued overrides mean "not given", so a trainer can always pass its config's values.
    llmc_io.load_model(path, norm_eps=None)
