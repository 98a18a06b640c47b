"""llm.c tokenizer files: bytes built here by hand from llm.c's layout (train_gpt2.py write_tokenizer:
a 256-int32 header [magic, version, n, eot], then per token a uint8 length and its bytes)."""

import struct

import numpy as np
import pytest

from llmc_io.__main__ import main
from llmc_io.errors import LLMCFormatError
from llmc_io.text.tokenizer import read_tokenizer, write_tokenizer

PIECES = [b"a", b"b", b" the", "\u00e9".encode(), b"<|endoftext|>"]


def handmade(pieces, magic=20240328, version=2, count=None, eot=4, tail=b""):
    slots = [magic, version, len(pieces) if count is None else count] + ([eot] if version == 2 else [])
    header = struct.pack("<256i", *(slots + [0] * (256 - len(slots))))
    return header + b"".join(struct.pack("<B", len(p)) + p for p in pieces) + tail


def test_reads_handmade_version2_and_decodes(tmp_path):
    path = tmp_path / "tok.bin"
    path.write_bytes(handmade(PIECES))
    tok = read_tokenizer(path)
    assert tok.tokens == tuple(PIECES) and tok.eot_token == 4 and tok.version == 2 and tok.vocab_size == 5
    assert tok.decode([4, 2, 3, 0]) == "<|endoftext|> theéa"
    # Half of a two-byte character still decodes (to U+FFFD), as a sampled sequence may hold it.
    assert tok.decode_bytes([1, 3]) == b"b\xc3\xa9"
    with pytest.raises(ValueError, match="expected 0..4, found 5"):
        tok.decode([5])


def test_writer_matches_the_handmade_bytes(tmp_path):
    write_tokenizer(tmp_path / "v2.bin", PIECES, eot_token=4)
    assert (tmp_path / "v2.bin").read_bytes() == handmade(PIECES)
    gpt2_like = [bytes([i % 256 or 1]) for i in range(50256)] + [b"<|endoftext|>"]
    write_tokenizer(tmp_path / "v1.bin", gpt2_like, version=1)
    assert (tmp_path / "v1.bin").read_bytes() == handmade(gpt2_like, version=1)
    tok = read_tokenizer(tmp_path / "v1.bin")
    # Version 1 holds no EOT slot; llm.c assumes GPT-2's 50256.
    assert tok.eot_token == 50256 and tok.version == 1 and tok.tokens == tuple(gpt2_like)


def test_llama3_magic_allows_empty_entries_and_defaults_eot(tmp_path):
    pieces = [b"x"] * 128001 + [b"", b"<|eot_id|>"]
    path = tmp_path / "llama.bin"
    path.write_bytes(handmade(pieces, magic=20240801, version=1))
    tok = read_tokenizer(path)
    assert tok.eot_token == 128001 and tok.tokens[128001] == b""


@pytest.mark.parametrize(
    "data, field",
    [
        (handmade(PIECES)[:1000], "file size"),
        (handmade(PIECES, magic=20240520), "header[0] magic"),
        (handmade(PIECES, version=3), "header[1] version"),
        (handmade(PIECES, version=1), "header[2] token count"),  # v1 needs 50257 tokens
        (handmade(PIECES, eot=5), "header[3] eot token"),
        (handmade(PIECES, count=0), "header[2] token count"),
        (handmade(PIECES)[:-3], "token 4 bytes"),
        (handmade(PIECES, count=5 + 1, tail=b""), "token 5 length byte"),
        (handmade(PIECES, tail=b"\x00\x01"), "file size"),
        (handmade([b"a", b"", b"c", b"d", b"e"]), "token 1 length"),
    ],
)
def test_malformed_files_are_one_line(tmp_path, data, field):
    path = tmp_path / "bad.bin"
    path.write_bytes(data)
    with pytest.raises(LLMCFormatError) as raised:
        read_tokenizer(path)
    assert raised.value.field == field
    assert str(raised.value).startswith(str(path)) and "\n" not in str(raised.value)


def test_missing_file(tmp_path):
    with pytest.raises(LLMCFormatError, match="nothing at that path"):
        read_tokenizer(tmp_path / "absent.bin")


def test_info_command(tmp_path, capsys):
    path = tmp_path / "tok.bin"
    path.write_bytes(handmade(PIECES))
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "tokenizer" in out and "4 = b'<|endoftext|>'" in out
    path.write_bytes(handmade(PIECES)[:-1])
    assert main(["info", str(path)]) == 2
    assert "token 4 bytes" in capsys.readouterr().err


def test_llama3_shard_is_not_taken_for_a_tokenizer(tmp_path, capsys):
    # Magic 20240801 is also the LLaMA-3 shard's (version 7); info must still read it as a shard.
    header = np.zeros(256, "<i4")
    header[:3] = (20240801, 7, 3)
    (tmp_path / "shard.bin").write_bytes(header.tobytes() + np.array([1, 2, 3], "<u4").tobytes())
    assert main(["info", str(tmp_path / "shard.bin")]) == 0
    assert "token shard" in capsys.readouterr().out
    with pytest.raises(LLMCFormatError, match="this is a LLaMA-3 token shard"):
        read_tokenizer(tmp_path / "shard.bin")


def test_encode_longest_match_decodes_back(tmp_path):
    path = tmp_path / "tok.bin"
    path.write_bytes(handmade(PIECES))
    tok = read_tokenizer(path)
    assert tok.encode_longest_match(b"a the") == [0, 2]  # no " " piece: " the" is taken whole
    assert tok.decode(tok.encode_longest_match("ab the\u00e9".encode())) == "ab the\u00e9"
    with pytest.raises(ValueError, match="prompt byte 0"):
        tok.encode_longest_match(b"z")
