"""Token shards (docs/formats.md §3), built by hand: [magic, version, ntok] + 253 zero slots, then tokens."""

import os
from pathlib import Path

import numpy as np
import pytest

from llmc_io import LLMCFormatError, read_shard, shard_info, write_shard

GPT2 = (20240520, 1, "<u2")
LLAMA3 = (20240801, 7, "<u4")


def hand_shard(path, tokens, kind=GPT2, ntok=None, version=None, magic=None):
    header = np.zeros(256, "<i4")
    header[:3] = [
        magic or kind[0],
        kind[1] if version is None else version,
        len(tokens) if ntok is None else ntok,
    ]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens).astype(kind[2]).tobytes())
    return str(path)


@pytest.mark.parametrize(
    "kind, name, tokens",
    [
        (GPT2, "gpt2", [50256, 0, 1, 65535, 7]),
        (LLAMA3, "llama3", [128000, 0, 1, 2**32 - 1, 128255]),
    ],
)
def test_hand_built_shards_read_by_magic(tmp_path, kind, name, tokens):
    path = hand_shard(tmp_path / "s.bin", tokens, kind)
    data = read_shard(path)
    assert isinstance(data, np.memmap) and data.dtype == np.dtype(kind[2])
    assert not data.flags.writeable
    assert data.tolist() == tokens
    info = shard_info(path)
    assert (info.kind, info.magic, info.version, info.num_tokens) == (name, kind[0], kind[1], 5)
    assert info.dtype == np.dtype(kind[2]).name
    assert info.expected_size == info.actual_size == 1024 + 5 * np.dtype(kind[2]).itemsize


@pytest.mark.parametrize("kind, name", [(GPT2, "gpt2"), (LLAMA3, "llama3")])
def test_writer_matches_the_hand_built_bytes_and_round_trips(tmp_path, kind, name):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50257 if name == "gpt2" else 128256, 1000)
    expected = hand_shard(tmp_path / "hand.bin", tokens, kind)
    write_shard(tmp_path / "a.bin", tokens, kind=name)
    assert (tmp_path / "a.bin").read_bytes() == Path(expected).read_bytes()
    write_shard(tmp_path / "b.bin", read_shard(tmp_path / "a.bin"), kind=name)
    assert (tmp_path / "b.bin").read_bytes() == (tmp_path / "a.bin").read_bytes()


def test_tinyshakespeare_sizes_from_formats(tmp_path):
    # GPT-2 train: 305,260 tokens -> 611,544 B; LLaMA-3 train: 276,224 tokens -> 1,105,920 B.
    write_shard(tmp_path / "g.bin", np.zeros(305_260, np.int64), kind="gpt2")
    write_shard(tmp_path / "l.bin", np.zeros(276_224, np.int64), kind="llama3")
    assert os.path.getsize(tmp_path / "g.bin") == 611_544
    assert os.path.getsize(tmp_path / "l.bin") == 1_105_920


def _error(path):
    with pytest.raises(LLMCFormatError) as info:
        read_shard(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def test_wrong_magic(tmp_path):
    message = _error(hand_shard(tmp_path / "s.bin", [1, 2], magic=12345))
    assert (
        "header[0] magic: expected 20240520 (GPT-2 token shard) or 20240801 (LLaMA-3 token shard), "
        "found 12345 (not an llm.c magic)" in message
    )
    message = _error(hand_shard(tmp_path / "m.bin", [1, 2], magic=20240326))
    assert "found 20240326 (GPT-2 model file); this is a model file, not a token shard" in message


def test_wrong_version(tmp_path):
    message = _error(hand_shard(tmp_path / "g.bin", [1, 2], version=2))
    assert "header[1] version: expected 1 for a gpt2 shard (magic 20240520), found 2" in message
    message = _error(hand_shard(tmp_path / "l.bin", [1, 2], LLAMA3, version=2))
    assert (
        "expected 7 for a llama3 shard (magic 20240801), found 2; "
        "there is no other LLaMA-3 shard version" in message
    )


def test_size_mismatch(tmp_path):
    message = _error(hand_shard(tmp_path / "short.bin", [1, 2, 3], ntok=4))
    assert "file size: expected 1,032 bytes (1024-byte header + 4 uint16 tokens), found 1,030" in message
    assert "2 bytes short" in message
    message = _error(hand_shard(tmp_path / "long.bin", [1, 2, 3], LLAMA3, ntok=2))
    assert "expected 1,032 bytes (1024-byte header + 2 uint32 tokens), found 1,036" in message


def test_empty_and_negative_and_headerless_shards(tmp_path):
    assert "header[2] ntok: expected at least 1 token, found 0; the shard is empty" in _error(
        hand_shard(tmp_path / "empty.bin", [])
    )
    assert "header[2] ntok: expected at least 1 token, found -5" in _error(
        hand_shard(tmp_path / "neg.bin", [], ntok=-5)
    )
    stub = tmp_path / "stub.bin"
    stub.write_bytes(b"\1" * 12)
    assert "expected at least 1,024 bytes (the header), found 12" in _error(str(stub))


def test_writer_rejects_tokens_that_do_not_fit(tmp_path):
    out = tmp_path / "s.bin"
    with pytest.raises(
        LLMCFormatError,
        match=r"tokens: expected values in \[0, 65535\] for a gpt2 shard, "
        r"found values in \[0, 128000\]; LLaMA-3 token ids need kind='llama3'",
    ):
        write_shard(out, [0, 128000], kind="gpt2")
    with pytest.raises(LLMCFormatError, match=r"values in \[-1, 3\]"):
        write_shard(out, [-1, 3], kind="llama3")
    with pytest.raises(LLMCFormatError, match="expected an integer array, found dtype float64"):
        write_shard(out, [1.0, 2.0])
    with pytest.raises(LLMCFormatError, match="expected between 1 and 2,147,483,647 tokens, found 0"):
        write_shard(out, np.zeros(0, np.uint16))
    with pytest.raises(LLMCFormatError, match="expected a 1-D array"):
        write_shard(out, np.zeros((2, 2), np.uint16))
    # 2**31 tokens through a zero-stride view: the count alone is rejected, no memory needed.
    huge = np.broadcast_to(np.uint16(0), (2**31,))
    with pytest.raises(LLMCFormatError, match="found 2,147,483,648; split the data into several shards"):
        write_shard(out, huge)
    with pytest.raises(ValueError, match="kind"):
        write_shard(out, [1], kind="gpt3")
    assert not out.exists()
