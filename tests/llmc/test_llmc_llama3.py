"""LLaMA-3 model files in both layouts, built by hand from docs/formats.md §2 (never with llmc_io's writer).

Tiny model: V=10, C=8, L=2, NH=2, NKV=1 (hd=4, kv=4, c_attn rows 16), ffn_dim_multiplier=1.3,
multiple_of=4, so H=28 by hand: 4C=32; floor(2*32/3)=21; floor(1.3f*21=27.3)=27; up to a multiple of 4.
"""

import os
import struct
from pathlib import Path

import numpy as np
import pytest

import llmc_io
from llmc_io import LAYOUT_INFINITRAIN, LAYOUT_LLMC, LLaMA3Header, LLMCFormatError, load_llama3, save_llama3

MAGIC = 20240803
V, C, L, NH, NKV, MAXT = 10, 8, 2, 2, 1, 16
KV = NKV * (C // NH)
H = 28
MULT, MULTIPLE_OF, EPS, THETA = 1.3, 4, 1e-5, 500000.0

TINY_TREE_SHAPES = {
    "wte/embedding": (V, C),
    "h/ln_1/scale": (L, C),
    "h/attn/c_attn/kernel": (L, C, C + 2 * KV),
    "h/attn/c_proj/kernel": (L, C, C),
    "h/ln_2/scale": (L, C),
    "h/mlp/c_fc/kernel": (L, C, H),
    "h/mlp/c_fc2/kernel": (L, C, H),
    "h/mlp/c_proj/kernel": (L, H, C),
    "ln_f/scale": (C,),
    "lm_head/kernel": (C, V),
}


def f32_bits(value):
    return struct.unpack("<i", struct.pack("<f", value))[0]


def model_tensors(seed=0, bf16_exact=False):
    """The model's tensors in (out, in) orientation, named as in §2a's list."""
    rng = np.random.default_rng(seed)
    shapes = {
        "wte": (V, C),
        "ln_1": (L, C),
        "c_attn": (L, C + 2 * KV, C),
        "attn_proj": (L, C, C),
        "ln_2": (L, C),
        "c_fc": (L, H, C),
        "c_fc2": (L, H, C),
        "mlp_proj": (L, C, H),
        "ln_f": (C,),
        "lm_head": (V, C),
    }
    t = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    if bf16_exact:
        t = {k: (v.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32) for k, v in t.items()}
    return t


def _tensor_bytes(arrays, version):
    if version == 5:
        return b"".join((a.view(np.uint32) >> 16).astype("<u2").tobytes() for a in arrays)
    return b"".join(a.astype("<f4").tobytes() for a in arrays)


def write_infinitrain(path, t, version=3, float_slots=None, major_minor=(1, 0), max_gen=4):
    """§2a: one header with fp32 bit patterns in slots 8/10/11 (or given raw slot values)."""
    header = np.zeros(256, "<i4")
    floats = float_slots or (f32_bits(MULT), f32_bits(EPS), f32_bits(THETA))
    header[:16] = [
        MAGIC,
        version,
        MAXT,
        V,
        L,
        NH,
        NKV,
        C,
        floats[0],
        MULTIPLE_OF,
        floats[1],
        floats[2],
        1,
        max_gen,
        *major_minor,
    ]
    order = ["wte", "ln_1", "c_attn", "attn_proj", "ln_2", "c_fc", "c_fc2", "mlp_proj", "ln_f", "lm_head"]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(_tensor_bytes([t[name] for name in order], version))
    return str(path)


def write_llmc_branch(path, t, version=3, biases=None):
    """§2b: int header + float header, GPT-2's 16 slots, zero biases, per-layer [c_fc; c_fc2]."""
    ints = np.zeros(256, "<i4")
    ints[:12] = [MAGIC, version, MAXT, V, L, NH, NKV, C, MULTIPLE_OF, 1, 3, 2]
    floats = np.full(256, 123.25, "<f4")  # the C writer leaves slots 3..255 uninitialised
    floats[:3] = [MULT, EPS, THETA]
    biases = biases or {}
    zeros = lambda name, *shape: biases.get(name, np.zeros(shape, np.float32))
    fcw = np.concatenate([t["c_fc"], t["c_fc2"]], axis=1)  # (L, 2H, C): layer l = c_fc rows, then c_fc2
    arrays = [
        t["wte"],
        t["lm_head"],
        t["ln_1"],
        zeros("ln1b", L, C),
        t["c_attn"],
        zeros("qkvb", L, C + 2 * KV),
        t["attn_proj"],
        zeros("attprojb", L, C),
        t["ln_2"],
        zeros("ln2b", L, C),
        fcw,
        zeros("fcb", L, 2 * H),
        t["mlp_proj"],
        zeros("fcprojb", L, C),
        t["ln_f"],
        zeros("lnfb", C),
    ]
    with open(path, "wb") as f:
        f.write(ints.tobytes())
        f.write(floats.tobytes())
        f.write(_tensor_bytes(arrays, version))
    return str(path)


def leaves(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_tree(params, t):
    flat = leaves(params)
    assert {k: v.shape for k, v in flat.items()} == TINY_TREE_SHAPES
    assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in flat.values())
    np.testing.assert_array_equal(params["wte"]["embedding"], t["wte"])
    np.testing.assert_array_equal(params["lm_head"]["kernel"], t["lm_head"].T)
    np.testing.assert_array_equal(params["ln_f"]["scale"], t["ln_f"])
    np.testing.assert_array_equal(params["h"]["ln_1"]["scale"], t["ln_1"])
    np.testing.assert_array_equal(params["h"]["ln_2"]["scale"], t["ln_2"])
    for layer in range(L):
        kernel = params["h"]["attn"]["c_attn"]["kernel"][layer]
        np.testing.assert_array_equal(kernel[:, :C], t["c_attn"][layer][:C].T)  # Q
        np.testing.assert_array_equal(kernel[:, C : C + KV], t["c_attn"][layer][C : C + KV].T)  # K
        np.testing.assert_array_equal(kernel[:, C + KV :], t["c_attn"][layer][C + KV :].T)  # V
        np.testing.assert_array_equal(params["h"]["attn"]["c_proj"]["kernel"][layer], t["attn_proj"][layer].T)
        np.testing.assert_array_equal(params["h"]["mlp"]["c_fc"]["kernel"][layer], t["c_fc"][layer].T)
        np.testing.assert_array_equal(params["h"]["mlp"]["c_fc2"]["kernel"][layer], t["c_fc2"][layer].T)
        np.testing.assert_array_equal(params["h"]["mlp"]["c_proj"]["kernel"][layer], t["mlp_proj"][layer].T)


TINY_HEADER = LLaMA3Header(
    max_seq_len=MAXT,
    vocab_size=V,
    num_layers=L,
    num_heads=NH,
    num_kv_heads=NKV,
    channels=C,
    ffn_dim_multiplier=MULT,
    multiple_of=MULTIPLE_OF,
    norm_eps=EPS,
    rope_theta=THETA,
    use_scaled_rope=True,
    max_gen_batch_size=4,
)


# ---- reading both layouts ------------------------------------------------------------------------


def test_infinitrain_layout_reads_to_the_spec_tree(tmp_path):
    t = model_tensors()
    path = write_infinitrain(tmp_path / "it.bin", t)
    header, params = load_llama3(path)
    assert header == TINY_HEADER
    assert header.ffn_dim_multiplier == float(np.float32(1.3)) and header.norm_eps == float(np.float32(1e-5))
    assert header.ffn_hidden_dim == H
    check_tree(params, t)
    info = llmc_io.model_info(path)
    assert (info.kind, info.layout, info.version, info.dtype, info.major_minor) == (
        "llama3",
        LAYOUT_INFINITRAIN,
        3,
        "float32",
        (1, 0),
    )
    assert info.expected_size == info.actual_size == os.path.getsize(path) == 1024 + 4 * header.num_parameters


def test_one_value_found_at_its_byte_offset(tmp_path):
    """Layer 1's c_fc2 (gate) row 5, column 2, located by hand from §2a's order."""
    t = model_tensors()
    path = write_infinitrain(tmp_path / "it.bin", t)
    start = 1024 + 4 * (V * C + L * C + L * (C + 2 * KV) * C + L * C * C + L * C + L * H * C)
    offset = start + 4 * (1 * H * C + 5 * C + 2)
    with open(path, "rb") as f:
        f.seek(offset)
        value = np.frombuffer(f.read(4), "<f4")[0]
    _, params = load_llama3(path)
    assert params["h"]["mlp"]["c_fc2"]["kernel"][1, 2, 5] == value == t["c_fc2"][1, 5, 2]


@pytest.mark.parametrize("version", [3, 5])
def test_llmc_branch_layout_reads_to_the_same_tree(tmp_path, version):
    t = model_tensors(bf16_exact=version == 5)
    path = write_llmc_branch(tmp_path / "branch.bin", t, version=version)
    header, params = load_llama3(path)
    assert header == TINY_HEADER  # max_gen_batch_size is not stored: the Python default 4
    check_tree(params, t)
    # The fc slot interleaves per layer: rows [0,H) are c_fc (up), rows [H,2H) c_fc2 (gate).
    fcw = np.concatenate([t["c_fc"], t["c_fc2"]], axis=1)
    np.testing.assert_array_equal(params["h"]["mlp"]["c_fc"]["kernel"][1], fcw[1, :H].T)
    np.testing.assert_array_equal(params["h"]["mlp"]["c_fc2"]["kernel"][1], fcw[1, H:].T)
    info = llmc_io.model_info(path)
    assert (info.layout, info.version, info.major_minor) == (LAYOUT_LLMC, version, (3, 2))
    assert info.num_stored_values == header.num_parameters + L * (4 * C + C + 2 * KV + 2 * H) + C
    assert os.path.getsize(path) == header.file_size(LAYOUT_LLMC, version)
    assert llmc_io.load_llama3(path, max_gen_batch_size=8)[0].max_gen_batch_size == 8


def test_multiplier_zero_means_none(tmp_path):
    """InfiniTrain writes 0.0 for an absent ffn_dim_multiplier and then skips the multiplication."""
    header = LLaMA3Header(MAXT, V, L, NH, NKV, C, 0.0, MULTIPLE_OF, EPS, THETA, True, 4)
    assert header.ffn_hidden_dim == 24  # 21 rounded up to a multiple of 4
    t = {k: v for k, v in model_tensors().items()}
    rng = np.random.default_rng(1)
    for name, shape in (("c_fc", (L, 24, C)), ("c_fc2", (L, 24, C)), ("mlp_proj", (L, C, 24))):
        t[name] = rng.standard_normal(shape).astype(np.float32)
    path = write_infinitrain(tmp_path / "none.bin", t, float_slots=(0, f32_bits(EPS), f32_bits(THETA)))
    loaded, _ = load_llama3(path)
    assert loaded == header


def test_version5_in_the_1kb_layout_reads_with_a_note(tmp_path):
    """llm.c master's bf16 export; InfiniTrain reads only version 3, but the tensors are unambiguous."""
    t = model_tensors(bf16_exact=True)
    path = write_infinitrain(tmp_path / "bf16.bin", t, version=5)
    _, params = load_llama3(path)
    check_tree(params, t)
    assert any("version 3" in note for note in llmc_io.model_info(path).notes)


# ---- writing ---------------------------------------------------------------------------------------


def test_write_read_write_is_byte_identical(tmp_path):
    path = write_infinitrain(tmp_path / "it.bin", model_tensors())
    header, params = load_llama3(path)
    save_llama3(tmp_path / "a.bin", header, params)
    assert (tmp_path / "a.bin").read_bytes() == Path(path).read_bytes()  # the writer matches §2a
    save_llama3(tmp_path / "b.bin", *load_llama3(tmp_path / "a.bin"))
    assert (tmp_path / "b.bin").read_bytes() == (tmp_path / "a.bin").read_bytes()


def test_llmc_branch_converts_to_the_infinitrain_bytes(tmp_path):
    t = model_tensors()
    branch = write_llmc_branch(tmp_path / "branch.bin", t)
    expected = write_infinitrain(tmp_path / "expected.bin", t, major_minor=(3, 2))
    info = llmc_io.model_info(branch)
    save_llama3(tmp_path / "out.bin", *load_llama3(branch), major_minor=info.major_minor)
    assert (tmp_path / "out.bin").read_bytes() == Path(expected).read_bytes()


def test_header_built_from_python_floats_round_trips(tmp_path):
    _, params = load_llama3(write_infinitrain(tmp_path / "it.bin", model_tensors()))
    header = LLaMA3Header(MAXT, V, L, NH, NKV, C, 1.3, MULTIPLE_OF, 1e-5, 5e5, 1, 4)
    save_llama3(tmp_path / "out.bin", header, params)
    assert load_llama3(tmp_path / "out.bin")[0] == header
    header_slots = np.fromfile(tmp_path / "out.bin", "<i4", count=16)
    assert list(header_slots[8:16]) == [f32_bits(1.3), 4, 0x3727C5AC, 0x48F42400, 1, 4, 1, 0]


def test_writer_rejects_trees_that_do_not_fit(tmp_path):
    _, params = load_llama3(write_infinitrain(tmp_path / "it.bin", model_tensors()))
    out = tmp_path / "out.bin"
    with_bias = {**params, "ln_f": {**params["ln_f"], "bias": np.zeros(C, np.float32)}}
    with pytest.raises(LLMCFormatError, match=r"params\[ln_f/bias\].*LLaMA-3 files have no biases"):
        save_llama3(out, TINY_HEADER, with_bias)
    without_head = {k: v for k, v in params.items() if k != "lm_head"}
    with pytest.raises(LLMCFormatError, match=r"params\[lm_head/kernel\]: expected an array, found nothing"):
        save_llama3(out, TINY_HEADER, without_head)
    with pytest.raises(LLMCFormatError, match=r"h/mlp/c_fc/kernel\]: expected shape \(2, 8, 32\)"):
        save_llama3(out, LLaMA3Header(MAXT, V, L, NH, NKV, C, 1.5, MULTIPLE_OF, 1e-5, 5e5, 1, 4), params)
    params["h"]["mlp"]["c_fc2"]["kernel"][0, 1, 2] = np.inf
    with pytest.raises(LLMCFormatError, match=r"tensor c_fc2 \(h/mlp/c_fc2/kernel\).*0 NaN and 1 inf"):
        save_llama3(out, TINY_HEADER, params)
    assert not out.exists()


# ---- docs/formats.md numbers ----------------------------------------------------------------------------

LLAMA_32_1B = LLaMA3Header(
    max_seq_len=8192,
    vocab_size=128256,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    channels=2048,
    ffn_dim_multiplier=1.4,
    multiple_of=1024,
    norm_eps=1e-5,
    rope_theta=500000.0,
    use_scaled_rope=True,
    max_gen_batch_size=4,
)


def test_llama_32_1b_numbers_from_formats():
    assert LLAMA_32_1B.ffn_hidden_dim == 8192
    assert LLAMA_32_1B.num_parameters == 1_498_482_688
    assert LLAMA_32_1B.num_parameters - 128256 * 2048 == 1_235_814_400  # without the duplicate lm_head
    assert LLAMA_32_1B.file_size(LAYOUT_INFINITRAIN, 3) == 5_993_931_776
    assert LLAMA_32_1B.num_stored_values(LAYOUT_LLMC) - LLAMA_32_1B.num_parameters == 444_416
    assert LLAMA_32_1B.file_size(LAYOUT_LLMC, 3) == 5_995_710_464
    assert LLAMA_32_1B.file_size(LAYOUT_LLMC, 5) == 2_997_856_256


@pytest.mark.parametrize(
    "channels, multiplier, expected", [(2048, 1.4, 8192), (3072, 1.0, 8192), (4096, 1.3, 14336)]
)
def test_ffn_hidden_dim_of_released_configs(channels, multiplier, expected):
    header = LLaMA3Header(8192, 128256, 16, 32, 8, channels, multiplier, 1024, 1e-5, 5e5, True, 4)
    assert header.ffn_hidden_dim == expected


# ---- bad input ---------------------------------------------------------------------------------------


def _error(path, **overrides):
    with pytest.raises(LLMCFormatError) as info:
        load_llama3(path, **overrides)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def test_gpt2_file_given_to_load_llama3(tmp_path):
    from test_llmc_gpt2 import tiny_file

    path, _ = tiny_file(tmp_path)
    message = _error(path)
    assert (
        "header[0] magic: expected 20240803 (LLaMA-3 model file), found 20240326 (GPT-2 model file)"
        in message
    )
    assert "use load_gpt2" in message


def test_wrong_magic_and_unknown_version(tmp_path):
    path = write_infinitrain(tmp_path / "it.bin", model_tensors())
    data = bytearray(Path(path).read_bytes())
    data[0:4] = struct.pack("<i", 20240520)
    Path(path).write_bytes(bytes(data))
    assert "found 20240520 (GPT-2 token shard)" in _error(path)
    data[0:8] = struct.pack("<ii", MAGIC, 4)
    Path(path).write_bytes(bytes(data))
    assert "header[1] version: expected 3 (fp32) or 5 (bf16), found 4" in _error(path)


@pytest.mark.parametrize("delta", [-4, +4])
def test_size_matching_neither_layout(tmp_path, delta):
    path = write_infinitrain(tmp_path / "it.bin", model_tensors())
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size + delta)
    message = _error(path)
    assert (
        f"file size: expected {size:,} bytes (infinitrain layout) or no size for the "
        f"llmc-llama3-branch layout (int header[9] use_scaled_rope: expected 0 or 1, found 4)" in message
    )
    assert f"found {size + delta:,}" in message


def test_truncated_branch_file_names_both_predictions(tmp_path):
    path = write_llmc_branch(tmp_path / "branch.bin", model_tensors())
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    message = _error(path)
    assert f"or {size:,} bytes (llmc-llama3-branch layout)" in message


def test_non_finite_weights_name_the_tensor(tmp_path):
    t = model_tensors()
    t["c_fc2"][1, 0, 0] = np.nan
    assert "tensor c_fc2 (h/mlp/c_fc2/kernel): expected finite values, found 1 NaN" in _error(
        write_infinitrain(tmp_path / "it.bin", t)
    )
    assert (
        "tensor fcw (h/mlp/c_fc/kernel + h/mlp/c_fc2/kernel): expected finite values, found 1 NaN and 0 inf, "
        f"the first at index (1, {H}, 0)" in _error(write_llmc_branch(tmp_path / "branch.bin", t))
    )


def test_nonzero_bias_in_the_branch_layout(tmp_path):
    qkvb = np.zeros((L, C + 2 * KV), np.float32)
    qkvb[1, 3] = 0.25
    message = _error(write_llmc_branch(tmp_path / "branch.bin", model_tensors(), biases={"qkvb": qkvb}))
    assert (
        "tensor qkvb (a bias of the llm.c llama3 layout): expected all zeros, found 1 nonzero values "
        "(largest |value| 0.25); LLaMA-3 has no biases" in message
    )


def _truncated_master_file(tmp_path, t=None):
    """llm.c master's write_model: int32 header[8] = int(1.3) = 1, [10] = int(1e-5) = 0, [11] = 500000."""
    return write_infinitrain(
        tmp_path / "master.bin", t or model_tensors(), float_slots=(1, 0, 500000), major_minor=(3, 1)
    )


def test_truncated_floats_are_detected_and_explained(tmp_path):
    message = _error(_truncated_master_file(tmp_path))
    assert "header[8,10,11] float fields: expected fp32 bit patterns" in message
    assert "found integers ffn_dim_multiplier=1, norm_eps=0, rope_theta=500000" in message
    assert "truncated the floats to int" in message and "train_llama3.py" in message
    assert "--config.llmc_ffn_dim_multiplier=1.4 --config.llmc_norm_eps=1e-5" in message
    # One value alone is not enough.
    assert "truncated" in _error(_truncated_master_file(tmp_path), ffn_dim_multiplier=1.3)


def test_truncated_floats_load_with_overrides(tmp_path):
    t = model_tensors()
    path = _truncated_master_file(tmp_path, t)
    header, params = load_llama3(path, ffn_dim_multiplier=1.3, norm_eps=1e-5)
    assert header == TINY_HEADER  # rope_theta 500000 survives truncation and is taken from the int
    check_tree(params, t)
    info = llmc_io.model_info(path, ffn_dim_multiplier=1.3, norm_eps=1e-5)
    assert info.layout == LAYOUT_INFINITRAIN and info.major_minor == (3, 1)
    assert any("truncated" in note for note in info.notes)
    # A wrong multiplier gives a wrong hidden dim; the file size says which one is right.
    message = _error(path, ffn_dim_multiplier=1.0, norm_eps=1e-5)
    assert "ffn hidden 24" in message and "the file size implies ffn hidden 28" in message


def test_overrides_must_agree_with_values_the_file_holds(tmp_path):
    path = write_infinitrain(tmp_path / "it.bin", model_tensors())
    assert load_llama3(path, norm_eps=1e-5, ffn_dim_multiplier=1.3)[0] == TINY_HEADER
    message = _error(path, norm_eps=1e-3)
    assert "norm_eps: expected the file's value 1e-05, found override 0.001" in message


def test_load_model_dispatches_to_llama3(tmp_path):
    path = _truncated_master_file(tmp_path)
    header, params = llmc_io.load_model(path, ffn_dim_multiplier=1.3, norm_eps=1e-5, rope_theta=None)
    assert isinstance(header, LLaMA3Header) and "lm_head" in params
    shard = tmp_path / "shard.bin"
    llmc_io.write_shard(shard, np.arange(5))
    with pytest.raises(LLMCFormatError, match="token shards are read with read_shard"):
        llmc_io.load_model(shard)
