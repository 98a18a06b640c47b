"""BPE tokenizers of text: a Hugging Face `tokenizer.json` or a tiktoken BPE file, read offline.

Both are used through their own libraries (`tokenizers`, `tiktoken`; the `text` extra), imported
only when a tokenizer is loaded. What the family decides:

- the special tokens of a tiktoken file, which holds only the mergeable ranks: GPT-2's
  `<|endoftext|>` right after the ranks (tiktoken_ext/openai_public.py `gpt2`: 50256), or LLaMA-3's
  256 specials from there on (meta-llama/llama-models models/llama3/tokenizer.py, also in
  pytorch/executorch pytorch_tokenizers/constants.py: `<|begin_of_text|>` = 128000, ...);
- the split pattern of a tiktoken file (GPT-2's r50k pattern, or LLaMA-3's cl100k-style one);
- the token that starts each document in a shard, as llm.c's dev/data scripts put it (fineweb.py and
  tinyshakespeare.py at llm.c d36f0e6): GPT-2 `<|endoftext|>`, LLaMA-3 `<|begin_of_text|>`;
- the EOT that samples start from and llm.c's tokenizer file names: GPT-2 `<|endoftext|>`,
  LLaMA-3 `<|end_of_text|>` (InfiniTrain example/common/tokenizer.cc at b24d92f, kLLaMA3Eot 128001).

Text is encoded as those scripts do: special tokens written in the text are ordinary text
(tiktoken's `encode_ordinary`, HF's `split_special_tokens=True`), and no BOS/EOS is added.
Byte-level ids (a token per byte, no tokenizer needed) come first, below.
"""

from __future__ import annotations

import base64
import binascii
import json
import os

import numpy as np

from llmc_io.errors import LLMCFormatError

FAMILIES = ("gpt2", "llama3")
GPT2_ENDOFTEXT = "<|endoftext|>"
LLAMA3_BEGIN, LLAMA3_END = "<|begin_of_text|>", "<|end_of_text|>"
DOCUMENT_START = {"gpt2": GPT2_ENDOFTEXT, "llama3": LLAMA3_BEGIN}
END_OF_TEXT = {"gpt2": GPT2_ENDOFTEXT, "llama3": LLAMA3_END}

# tiktoken_ext/openai_public.py r50k_pat_str (GPT-2; tiktoken 0.14).
GPT2_SPLIT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# meta-llama/llama-models models/llama3/tokenizer.py pat_str.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_NUM_SPECIAL = 256
_LLAMA3_NAMED_SPECIALS = (
    LLAMA3_BEGIN,
    LLAMA3_END,
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
)
REPLACEMENT = "\ufffd"  # what an id outside the tokenizer decodes to


# --- byte-level token ids, without a tokenizer -----------------------------------------------------
# Byte-level token ids: one token per byte of text, for either model family, NumPy only.
#
# GPT-2's first 256 token ids are the 256 bytes in the order of openai/gpt-2 encoder.py's
# bytes_to_unicode (the printable bytes first, in their own order, then the rest in
# increasing order). LLaMA-3's tokenizer (tiktoken-style, from cl100k) keeps the same order
# for its first 256 ids (both have '\n' = 198), so these ids decode with either family's
# real tokenizer. Documents are delimited as llm.c's dev/data scripts do: each starts with
# GPT-2's <|endoftext|> (50256) or LLaMA-3's <|begin_of_text|> (128000, what
# `tokenizer.encode('')[0]` gives there).

DOCUMENT_START_ID = {"gpt2": 50256, "llama3": 128000}


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
    start = DOCUMENT_START_ID[family]
    dtype = np.uint16 if family == "gpt2" else np.uint32
    pieces = []
    for document in documents:
        pieces += [np.array([start], dtype), encode_bytes(document).astype(dtype)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype)


# --- BPE tokenizers --------------------------------------------------------------------------------


def llama3_special_tokens(first_id: int) -> dict[str, int]:
    reserved = [
        f"<|reserved_special_token_{2 + i}|>" for i in range(LLAMA3_NUM_SPECIAL - len(_LLAMA3_NAMED_SPECIALS))
    ]
    return {name: first_id + i for i, name in enumerate(_LLAMA3_NAMED_SPECIALS + tuple(reserved))}


def _missing_library(path, module: str) -> LLMCFormatError:
    return LLMCFormatError(
        path,
        "tokenizer",
        f"the {module} package to read it",
        "it is not installed",
        f"pip install {module} (a dependency of jaxtrain: pip install -e . installs it)",
    )


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (openai/gpt-2 encoder.py), which byte-level BPE
    vocabularies (HF's ByteLevel) spell their tokens in."""
    chars, extra = {}, 0
    for b in range(256):
        if b in PRINTABLE_BYTES:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class TextTokenizer:
    """A BPE tokenizer of either library, seen the same way: encode, decode, the bytes of each id."""

    kind = ""

    def __init__(self, path: str, family: str):
        self.path, self.family = path, family

    # Implemented by each library's class.
    def encode_batch(self, texts) -> list[list[int]]:
        raise NotImplementedError

    def _decode_known(self, ids: list[int]) -> str:
        raise NotImplementedError

    def token_id(self, text: str) -> int | None:
        raise NotImplementedError

    def all_token_bytes(self) -> list[bytes]:
        """The bytes of ids 0..vocab_size-1 (b'' for an id it lacks), as llm.c's file holds them."""
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        """max id + 1: the count llm.c's tokenizer file holds."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def special_id(self, name: str, role: str) -> int:
        found = self.token_id(name)
        if found is None:
            raise LLMCFormatError(
                self.path,
                f"{role} token",
                f"{name!r} among its tokens (the {self.family} convention)",
                "no such token",
                "add it as a special token, or pass the other --family",
            )
        return found

    @property
    def document_start(self) -> int:
        return self.special_id(DOCUMENT_START[self.family], "document start")

    @property
    def eot_name(self) -> str:
        return END_OF_TEXT[self.family]

    @property
    def eot_token(self) -> int:
        return self.special_id(END_OF_TEXT[self.family], "end of text")

    def decode(self, ids) -> str:
        """Text of `ids`; ids the tokenizer lacks (a model's vocabulary may be larger) print as U+FFFD."""
        text, run = [], []
        for token_id in (int(i) for i in ids):
            if 0 <= token_id < self.vocab_size and self._known(token_id):
                run.append(token_id)
                continue
            if run:
                text.append(self._decode_known(run))
                run = []
            text.append(REPLACEMENT)
        if run:
            text.append(self._decode_known(run))
        return "".join(text)

    def _known(self, token_id: int) -> bool:
        return True


class HFTokenizer(TextTokenizer):
    kind = "Hugging Face tokenizer.json"

    def __init__(self, path: str, family: str):
        super().__init__(path, family)
        try:
            import tokenizers
        except ImportError:
            raise _missing_library(path, "tokenizers") from None
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(path)
        except Exception as error:  # noqa: BLE001  the Rust library's messages are one line
            raise LLMCFormatError(
                path,
                "content",
                "a Hugging Face tokenizer.json",
                f"unreadable ({error})",
                "pass the tokenizer.json of the model's Hugging Face folder (tokenizers' save() writes one)",
            ) from None
        # llm.c's fineweb.py passes split_special_tokens=True: '<|endoftext|>' in a document is text.
        self._tokenizer.encode_special_tokens = True
        self._vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        self._ids = set(self._vocab.values())
        self._added = {t.content for t in self._tokenizer.get_added_tokens_decoder().values()}

    @property
    def special_tokens(self) -> dict[str, int]:
        """The added (special) tokens: name -> id."""
        return {token: self._vocab[token] for token in self._added if token in self._vocab}

    def encode_batch(self, texts) -> list[list[int]]:
        encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encoded]

    def _decode_known(self, ids) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def _known(self, token_id: int) -> bool:
        return token_id in self._ids

    def token_id(self, text: str) -> int | None:
        return self._vocab.get(text)

    @property
    def vocab_size(self) -> int:
        return max(self._vocab.values()) + 1

    def all_token_bytes(self) -> list[bytes]:
        decoder = json.loads(self._tokenizer.to_str()).get("decoder") or {}
        if decoder.get("type") != "ByteLevel":
            raise LLMCFormatError(
                self.path,
                "decoder",
                "ByteLevel (GPT-2 / LLaMA-3 style BPE, whose tokens are bytes)",
                decoder.get("type"),
                "llm.c's tokenizer file needs each token's bytes",
            )
        pieces = []
        for token_id in range(self.vocab_size):
            token = self._tokenizer.id_to_token(token_id)
            if token is None:
                pieces.append(b"")
            elif token in self._added:
                pieces.append(token.encode())
            else:
                pieces.append(bytes(_UNICODE_TO_BYTE[c] for c in token))
        return pieces


_UNICODE_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}


def read_tiktoken_ranks(path: str) -> dict[bytes, int]:
    """The mergeable ranks of a tiktoken BPE file: one 'BASE64 RANK' per line.

    Read here, not with tiktoken.load.load_tiktoken_bpe, whose cache is keyed by the path and
    would serve an old copy of a file rewritten in place."""
    ranks = {}
    line_of_rank, line_of_piece = {}, {}  # tiktoken panics on a rank given twice: refused here
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split()
            try:
                if len(parts) != 2:
                    raise ValueError
                piece, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
            except (ValueError, binascii.Error):
                shown = line[:60].decode("latin-1").rstrip()
                raise LLMCFormatError(
                    path, f"line {number}", "'BASE64 RANK' (a tiktoken BPE file)", repr(shown)
                ) from None
            _check_new_rank(path, number, piece, rank, line_of_rank, line_of_piece)
            ranks[piece] = rank
            line_of_rank[rank], line_of_piece[piece] = number, number
    if not ranks:
        raise LLMCFormatError(path, "ranks", "at least one 'BASE64 RANK' line", "none")
    return ranks


def _check_new_rank(path, number: int, piece: bytes, rank: int, line_of_rank: dict, line_of_piece: dict):
    """Each token once, each rank (its id) once, none negative: what tiktoken needs of its ranks."""
    problem = None
    if rank < 0:
        problem = "a rank >= 0 (a token id)", f"rank {rank}"
    elif rank in line_of_rank:
        problem = "a rank no earlier line gives", f"rank {rank}, which line {line_of_rank[rank]} also gives"
    elif piece in line_of_piece:
        problem = "a token no earlier line lists", f"{piece!r}, which line {line_of_piece[piece]} also lists"
    if problem:
        raise LLMCFormatError(
            path, f"line {number}", *problem, "the file is damaged or was edited; use the file as published"
        )


class TiktokenTokenizer(TextTokenizer):
    kind = "tiktoken BPE file"

    def __init__(self, path: str, family: str):
        super().__init__(path, family)
        try:
            import tiktoken
        except ImportError:
            raise _missing_library(path, "tiktoken") from None
        ranks = read_tiktoken_ranks(path)
        first_special = max(ranks.values()) + 1
        if family == "gpt2":
            specials, pattern = {GPT2_ENDOFTEXT: first_special}, GPT2_SPLIT
        else:
            specials, pattern = llama3_special_tokens(first_special), LLAMA3_SPLIT
        missing = [b for b in range(256) if bytes([b]) not in ranks]
        if missing:
            raise LLMCFormatError(
                path,
                "ranks",
                "a rank for each of the 256 single bytes (byte-level BPE)",
                f"{len(missing)} missing, first byte {missing[0]}",
            )
        self._encoding = tiktoken.Encoding(
            name=os.path.basename(path), pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
        )
        self.special_tokens = specials
        self._bytes = {rank: piece for piece, rank in ranks.items()}
        self._bytes.update({rank: name.encode() for name, rank in specials.items()})

    def encode_batch(self, texts) -> list[list[int]]:
        return self._encoding.encode_ordinary_batch(list(texts))

    def _decode_known(self, ids) -> str:
        return self._encoding.decode(ids, errors="replace")

    def _known(self, token_id: int) -> bool:
        return token_id in self._bytes

    def token_id(self, text: str) -> int | None:
        return self.special_tokens.get(text)

    @property
    def vocab_size(self) -> int:
        return self._encoding.max_token_value + 1

    def all_token_bytes(self) -> list[bytes]:
        return [self._bytes.get(i, b"") for i in range(self.vocab_size)]


def is_hf_tokenizer_json(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(64).lstrip()[:1] == b"{"


def is_bpe_tokenizer_file(path) -> bool:
    """A tokenizer.json, or a file whose first line is a tiktoken 'BASE64 RANK' line."""
    if not os.path.isfile(path):
        return False
    if is_hf_tokenizer_json(path):
        return True
    with open(path, "rb") as f:
        parts = f.readline(512).split()
    try:
        return len(parts) == 2 and bool(base64.b64decode(parts[0], validate=True)) and int(parts[1]) >= 0
    except (ValueError, binascii.Error):
        return False


def load_text_tokenizer(path: str | os.PathLike, family: str) -> TextTokenizer:
    """The tokenizer in `path`: a tokenizer.json (it starts with '{') or else a tiktoken BPE file."""
    path = os.fspath(path)
    if family not in FAMILIES:
        raise LLMCFormatError(path, "family", " or ".join(FAMILIES), family)
    if not os.path.isfile(path):
        found = "a directory" if os.path.isdir(path) else "nothing"
        raise LLMCFormatError(path, "tokenizer", "a tokenizer.json or a tiktoken BPE file", found)
    if is_hf_tokenizer_json(path):
        return HFTokenizer(path, family)
    return TiktokenTokenizer(path, family)
