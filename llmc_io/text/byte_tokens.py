"""Byte-level token ids: one token per byte of text, for either model family, NumPy only.

GPT-2's first 256 token ids are the 256 bytes in the order of openai/gpt-2 encoder.py's
bytes_to_unicode (the printable bytes first, in their own order, then the rest in
increasing order). LLaMA-3's tokenizer (tiktoken-style, from cl100k) keeps the same order
for its first 256 ids (both have '\\n' = 198), so these ids decode with either family's
real tokenizer. Documents are delimited as llm.c's dev/data scripts do: each starts with
GPT-2's <|endoftext|> (50256) or LLaMA-3's <|begin_of_text|> (128000, what
`tokenizer.encode('')[0]` gives there).
"""

from __future__ import annotations

import numpy as np

DOCUMENT_START = {"gpt2": 50256, "llama3": 128000}


# The bytes GPT-2's encoder.py spells as themselves, in its order.
PRINTABLE_BYTES = (
    list(range(ord("!"), ord("~") + 1))
    + list(range(ord("¡"), ord("¬") + 1))
    + list(range(ord("®"), ord("ÿ") + 1))
)


def _byte_order() -> list[int]:
    return PRINTABLE_BYTES + [b for b in range(256) if b not in PRINTABLE_BYTES]


BYTE_TO_TOKEN = np.zeros(256, np.uint16)
BYTE_TO_TOKEN[_byte_order()] = np.arange(256, dtype=np.uint16)
TOKEN_TO_BYTE = np.array(_byte_order(), np.uint8)


def encode_bytes(data: bytes) -> np.ndarray:
    """Token ids (uint16), one per byte of `data`."""
    return BYTE_TO_TOKEN[np.frombuffer(data, np.uint8)]


def encode_documents(documents, family: str) -> np.ndarray:
    """The family's document-start id, then the bytes' ids, for each document (bytes)."""
    start = DOCUMENT_START[family]
    dtype = np.uint16 if family == "gpt2" else np.uint32
    pieces = []
    for document in documents:
        pieces += [np.array([start], dtype), encode_bytes(document).astype(dtype)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype)
