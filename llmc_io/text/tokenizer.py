"""llm.c's tokenizer file: the byte string of every token id, for decoding what a model writes.

Layout (karpathy/llm.c train_gpt2.py `write_tokenizer` and llmc/tokenizer.h `tokenizer_init`, at
llm.c f1e2ace; InfiniTrain example/common/tokenizer.cc at b24d92f):

- a 1024-byte header of 256 little-endian int32 slots: [0] magic, [1] version, [2] n (token count,
  max_token_value + 1), [3] the EOT id (version 2 only);
- then for i = 0..n-1: one uint8 length followed by that many raw bytes (tiktoken's
  `decode_bytes([i])`, so GPT-2's EOT entry is the 13 bytes `<|endoftext|>`). Nothing follows.

Magic 20240328 is llm.c's GPT-2 tokenizer; version 1 has no EOT slot and llm.c then requires
n = 50257 and takes EOT = 50256. InfiniTrain also reads magic 20240801 as a LLaMA-3 tokenizer
(version 1 EOT = 128001) and, unlike llm.c, allows empty entries there.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from llmc_io import header as hdr
from llmc_io.atomic_file import atomic_output
from llmc_io.errors import LLMCFormatError

GPT2_TOKENIZER_MAGIC = 20240328
LLAMA3_TOKENIZER_MAGIC = 20240801
VERSIONS = (1, 2)
# Version 1 files hold no EOT slot; these are the ids their readers assume.
VERSION1_EOT = {GPT2_TOKENIZER_MAGIC: 50256, LLAMA3_TOKENIZER_MAGIC: 128001}
GPT2_VOCAB_SIZE = 50257
MAX_TOKEN_BYTES = 255  # the length is one uint8


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """Decoding table of an llm.c tokenizer file: tokens[i] is the byte string of id i."""

    tokens: tuple[bytes, ...]
    eot_token: int
    magic: int = GPT2_TOKENIZER_MAGIC
    version: int = 2
    path: str = ""  # where it was read from ('' = built in), for error messages

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def decode_bytes(self, ids) -> bytes:
        """The concatenated bytes of `ids`; an id outside [0, vocab_size) is a ValueError."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise ValueError(
                f"{self.path or 'tokenizer'}: token id: expected 0..{self.vocab_size - 1}, found "
                f"{int(bad[0])}; the model's vocabulary is larger than the tokenizer's"
            )
        return b"".join(self.tokens[i] for i in ids.tolist())

    def encode_longest_match(self, data: bytes) -> list[int]:
        """Ids whose bytes concatenate to `data`, taking the longest known piece at each point.

        The file holds no BPE merges, so these need not be the ids tiktoken would give (they
        decode to the same bytes); a byte no piece starts with is a ValueError.
        """
        index: dict[bytes, int] = {}
        for token_id, piece in enumerate(self.tokens):
            if piece and token_id != self.eot_token:
                index.setdefault(piece, token_id)
        longest = max(map(len, index), default=0)
        ids, at = [], 0
        while at < len(data):
            for size in range(min(longest, len(data) - at), 0, -1):
                if data[at : at + size] in index:
                    ids.append(index[data[at : at + size]])
                    at += size
                    break
            else:
                raise ValueError(
                    f"{self.path or 'tokenizer'}: prompt byte {at}: expected a byte some token starts with, "
                    f"found {data[at : at + 1]!r}; pass the ids with --prompt_ids"
                )
        return ids

    def decode(self, ids) -> str:
        """Text of `ids`: UTF-8, with U+FFFD where a byte sequence is not (BPE pieces may split
        a character, and a sampled sequence need not be valid UTF-8)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def _check_table(path, magic: int, tokens) -> None:
    for i, piece in enumerate(tokens):
        if len(piece) > MAX_TOKEN_BYTES:
            raise LLMCFormatError(
                path, f"token {i} length", f"at most {MAX_TOKEN_BYTES} bytes (one uint8)", len(piece)
            )
        if not piece and magic == GPT2_TOKENIZER_MAGIC:
            raise LLMCFormatError(
                path, f"token {i} length", "at least 1 byte (llm.c asserts it)", 0, "give every id its bytes"
            )


def write_tokenizer(
    path: str | os.PathLike,
    tokens,
    eot_token: int | None = None,
    *,
    version: int = 2,
    magic: int = GPT2_TOKENIZER_MAGIC,
) -> None:
    """Writes an llm.c tokenizer file; version 1 writes no EOT slot (and needs GPT-2's 50257 ids)."""
    tokens = [bytes(t) for t in tokens]
    if magic not in VERSION1_EOT:
        raise LLMCFormatError(path, "magic", f"{GPT2_TOKENIZER_MAGIC} or {LLAMA3_TOKENIZER_MAGIC}", magic)
    if version not in VERSIONS:
        raise LLMCFormatError(path, "version", "1 or 2", version)
    if version == 1:
        if magic == GPT2_TOKENIZER_MAGIC and len(tokens) != GPT2_VOCAB_SIZE:
            raise LLMCFormatError(
                path, "token count", f"{GPT2_VOCAB_SIZE} for version 1", len(tokens), "write version 2"
            )
        if eot_token not in (None, VERSION1_EOT[magic]):
            raise LLMCFormatError(
                path, "eot_token", f"{VERSION1_EOT[magic]} for version 1", eot_token, "write version 2"
            )
        slots = {0: magic, 1: 1, 2: len(tokens)}
    else:
        if eot_token is None or not 0 <= eot_token < len(tokens):
            raise LLMCFormatError(path, "eot_token", f"an id in 0..{len(tokens) - 1}", eot_token)
        slots = {0: magic, 1: 2, 2: len(tokens), 3: eot_token}
    _check_table(path, magic, tokens)
    with atomic_output(path) as f:
        f.write(hdr.pack_header(slots))
        for piece in tokens:
            f.write(bytes([len(piece)]) + piece)


def read_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Reads and checks a whole tokenizer file; every malformed file is one LLMCFormatError line."""
    path = os.fspath(path)
    header = hdr.read_header(path)  # a missing or short file is already one clear line
    magic, version, count = (int(v) for v in header[:3])
    if magic not in VERSION1_EOT:
        expected = (
            f"{hdr.describe_magic(GPT2_TOKENIZER_MAGIC)} or {LLAMA3_TOKENIZER_MAGIC} (LLaMA-3 tokenizer)"
        )
        found = hdr.describe_magic(magic)
        raise LLMCFormatError(path, "header[0] magic", expected, found, "pass a tokenizer file")
    if version not in VERSIONS:
        shard = magic == LLAMA3_TOKENIZER_MAGIC and version == 7
        hint = "this is a LLaMA-3 token shard (magic 20240801, version 7), not a tokenizer" if shard else None
        raise LLMCFormatError(path, "header[1] version", "1 or 2", version, hint)
    with open(path, "rb") as f:
        data = f.read()
    body = data[hdr.HEADER_BYTES :]
    # Each entry takes 1..256 bytes, so the count is bounded by the file's size.
    if count <= 0:
        raise LLMCFormatError(path, "header[2] token count", "at least 1", count)
    if count > len(body):
        raise LLMCFormatError(
            path,
            "header[2] token count",
            f"at most {len(body):,} (each token takes one byte or more, and {len(body):,} follow the header)",
            count,
            "the file is truncated",
        )
    if version == 1:
        if magic == GPT2_TOKENIZER_MAGIC and count != GPT2_VOCAB_SIZE:
            raise LLMCFormatError(
                path, "header[2] token count", f"{GPT2_VOCAB_SIZE} for version 1 (llm.c asserts it)", count
            )
        eot = VERSION1_EOT[magic]
    else:
        eot = int(header[3])
    if not 0 <= eot < count:
        raise LLMCFormatError(path, "header[3] eot token", f"an id in 0..{count - 1}", eot)

    tokens, at = [], 0
    for i in range(count):
        if at >= len(body):
            raise LLMCFormatError(
                path, f"token {i} length byte", f"{count:,} tokens", f"the file ends after {i:,}", "truncated"
            )
        length = body[at]
        piece = body[at + 1 : at + 1 + length]
        if len(piece) < length:
            found = f"{len(piece)} before the end of the file"
            raise LLMCFormatError(path, f"token {i} bytes", f"{length} bytes", found, "it is truncated")
        tokens.append(piece)
        at += 1 + length
    if at != len(body):
        raise LLMCFormatError(
            path,
            "file size",
            f"{hdr.HEADER_BYTES + at:,} bytes (header + {count:,} tokens)",
            f"{len(data):,}",
            "header[2] token count is wrong or the file has trailing data",
        )
    _check_table(path, magic, tokens)
    return Tokenizer(tuple(tokens), eot, magic, version, path)


def is_tokenizer_file(path: str | os.PathLike) -> bool:
    """True when the header's magic is a tokenizer's (20240801 is also a LLaMA-3 shard's; the
    shard's version 7 tells them apart)."""
    magic, version = (int(v) for v in hdr.read_header(path)[:2])
    return magic == GPT2_TOKENIZER_MAGIC or (magic == LLAMA3_TOKENIZER_MAGIC and version in VERSIONS)
