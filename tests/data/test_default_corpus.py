"""The offline default corpus: GPT-2 byte ids checked against known vocabulary facts, and its shards.

The facts come from GPT-2's encoder.json, where the byte tokens are ids 0..255: '!' is 0, 'A' is 32,
'Ġ' (the space byte) is 220, 'Ċ' (newline) is 198 and 'Ā' (byte 0) is 188.
"""

import os

import numpy as np
import pytest

from jaxtrain.data import default_corpus
from jaxtrain.data.default_corpus import (
    EOT_TOKEN,
    VAL_TOKENS,
    decode_tokens,
    encode_bytes,
    ensure_default_corpus,
)


def read_header_and_tokens(path):
    """An llm.c token shard read with plain NumPy: 256 int32 header, then uint16 tokens."""
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], "<i4")
    return header, np.frombuffer(raw[1024:], "<u2")


def test_byte_ids_match_gpt2_vocabulary():
    facts = {
        b"!": 0,
        b'"': 1,
        b"A": 32,
        b"~": 93,
        b"\xa1": 94,
        b"\xae": 106,
        b"\xff": 187,
        b"\x00": 188,
        b"\n": 198,
        b" ": 220,
        b"\x7f": 221,
        b"\xad": 255,
    }
    for byte, token in facts.items():
        assert int(encode_bytes(byte)[0]) == token, byte
    assert sorted(encode_bytes(bytes(range(256))).tolist()) == list(range(256))  # a permutation


def test_round_trip_and_eot():
    data = bytes(range(256)) + "héllo, wörld\n\tdef f(): pass".encode()
    ids = encode_bytes(data)
    assert ids.dtype == np.uint16
    assert decode_tokens(ids) == data
    assert decode_tokens([EOT_TOKEN, 71, 72, EOT_TOKEN]) == b"<|endoftext|>hi<|endoftext|>"
    with pytest.raises(ValueError, match="found 256"):
        decode_tokens([256])


def test_build_cache_and_reuse(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXTRAIN_CACHE", str(tmp_path / "cache"))
    train_path, val_path = ensure_default_corpus()
    assert os.path.dirname(train_path) == str(tmp_path / "cache")

    train_header, train_tokens = read_header_and_tokens(train_path)
    val_header, val_tokens = read_header_and_tokens(val_path)
    assert train_header[:3].tolist() == [20240520, 1, len(train_tokens)]
    assert val_header[:3].tolist() == [20240520, 1, VAL_TOKENS]
    assert not train_header[3:].any() and not val_header[3:].any()
    assert len(train_tokens) == default_corpus.TRAIN_TOKENS
    assert train_tokens[0] == EOT_TOKEN  # each file is preceded by EOT
    assert set(np.unique(train_tokens).tolist()) <= set(range(256)) | {EOT_TOKEN}
    # The first file's text is a stdlib source file, decodable as-is.
    first = decode_tokens(train_tokens[1:]).split(b"<|endoftext|>")[0]
    assert first == default_corpus.stdlib_sources()[0].read_bytes()
    # No temp files are left behind.
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(
        [os.path.basename(train_path), os.path.basename(val_path)]
    )

    # Present files are reused, not rebuilt.
    built = os.stat(train_path).st_mtime_ns
    monkeypatch.setattr(default_corpus, "build_tokens", lambda *a, **k: pytest.fail("rebuilt"))
    assert ensure_default_corpus() == (train_path, val_path)
    assert os.stat(train_path).st_mtime_ns == built


def test_build_is_deterministic(tmp_path):
    first = ensure_default_corpus(tmp_path / "one")
    second = ensure_default_corpus(tmp_path / "two")
    for a, b in zip(first, second):
        assert open(a, "rb").read() == open(b, "rb").read()


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("JAXTRAIN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_corpus.cache_dir() == tmp_path / "xdg" / "jaxtrain"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_corpus.cache_dir() == tmp_path / "home" / ".cache" / "jaxtrain"
