"""An offline default corpus, the Python standard library's own source as byte tokens, and
the tokenizer that turns a run's token ids into text and back.

With no input_bin the trainer still needs real text that exists on every machine without a download.
The stdlib's *.py files (sorted, so the corpus is deterministic for a given Python) are encoded one
byte per token with GPT-2's byte-level ids, so the real GPT-2 tokenizer (and llm.c's tokenizer file)
decodes them; each file is preceded by the end-of-text token 50256, as llm.c's fineweb.py does for
documents. The stream is capped so building takes about a second and is written once, as
ordinary llm.c GPT-2 shards (magic 20240520, version 1, uint16), to the cache directory.

LLaMA-3 gets the same bytes as the same ids (its tokenizer's first 256 ids are the bytes in
GPT-2's order: llmc_io/text/bpe.py), each file preceded by <|begin_of_text|> 128000 (llm.c's
dev/data delimiter for llama-3) instead of 50256, in LLaMA-3 shards (magic 20240801, uint32).

The tokenizer (samples, `jaxtrain.generate`) is one of: llm.c's tokenizer file
(`tokenizer_bin`, decode only: it holds no merges), a BPE tokenizer (`tokenizer`: a Hugging
Face tokenizer.json or a tiktoken BPE file, llmc_io/text/bpe.py), or, for GPT-2's or LLaMA-3's
vocabulary without either, the built-in byte-level tokenizer of the default corpus.

The built-in tokenizer needs no file and no download. The corpus is GPT-2 token ids of single
bytes, plus EOT before each file. Its byte -> id table is therefore the whole vocabulary it
uses, and inverting it gives an llm.c-style tokenizer (llmc_io.Tokenizer) with GPT-2's 50257
ids: ids 0..255 are GPT-2's own single-byte tokens, 50256 is `<|endoftext|>`, and the BPE
merges (ids 256..50255), which the corpus never holds, decode to U+FFFD, so that an untrained
model's sample still prints.

LLaMA-3's built-in corpus holds the same byte ids (its tokenizer keeps GPT-2's order for the
first 256) and <|begin_of_text|> before each file, so the same table over LLaMA-3's 128256 ids
decodes it; there the start token is <|begin_of_text|>, where the corpus's documents start.
"""

from __future__ import annotations

import os
import pathlib
import sys
import sysconfig
import tempfile
import time

import numpy as np

from llmc_io.text.bpe import BYTE_TO_TOKEN, TOKEN_TO_BYTE, encode_bytes  # noqa: F401
from llmc_io.text.bpe import DOCUMENT_START_ID as DOCUMENT_START
from llmc_io.text.tokenizer import GPT2_VOCAB_SIZE, Tokenizer

EOT_TOKEN = 50256
TRAIN_TOKENS = 3 * 2**20  # 3,145,728: enough that a small model does not memorise it in minutes
VAL_TOKENS = 2**17  # 131,072: the tail of the capped stream, never seen in training
# Bump when the corpus recipe changes, so stale cache files are not reused under the same name.
CORPUS_VERSION = 1


def decode_tokens(ids) -> bytes:
    """Bytes of byte-level GPT-2 token ids; EOT decodes to b'<|endoftext|>' as in GPT-2's vocabulary."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    bad = ids[((ids < 0) | (ids >= 256)) & (ids != EOT_TOKEN)]
    if bad.size:
        raise ValueError(
            f"decode_tokens: token id: expected 0..255 (byte tokens) or {EOT_TOKEN} (EOT), "
            f"found {int(bad[0])}; only byte-level ids can be decoded without the BPE merges"
        )
    pieces, start = [], 0
    for eot_at in np.flatnonzero(ids == EOT_TOKEN):
        pieces += [TOKEN_TO_BYTE[ids[start:eot_at]].tobytes(), b"<|endoftext|>"]
        start = eot_at + 1
    pieces.append(TOKEN_TO_BYTE[ids[start:]].tobytes())
    return b"".join(pieces)


def stdlib_sources(stdlib_dir: str | None = None) -> list[pathlib.Path]:
    """The stdlib's *.py files sorted by relative path; installed packages are not the stdlib."""
    root = pathlib.Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    paths = [
        p
        for p in root.rglob("*.py")
        if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)
    ]
    return sorted(paths, key=lambda p: p.relative_to(root).as_posix())


def build_tokens(stdlib_dir: str | None = None, total_tokens: int = TRAIN_TOKENS + VAL_TOKENS) -> np.ndarray:
    """The first `total_tokens` tokens of EOT + file bytes, over the sorted stdlib sources."""
    chunks, count = [], 0
    for path in stdlib_sources(stdlib_dir):
        if count >= total_tokens:
            break
        chunk = np.concatenate([[EOT_TOKEN], encode_bytes(path.read_bytes())]).astype(np.uint16)
        chunks.append(chunk)
        count += len(chunk)
    tokens = np.concatenate(chunks)[:total_tokens] if chunks else np.zeros(0, np.uint16)
    if len(tokens) < total_tokens:
        raise RuntimeError(
            f"default corpus: stdlib tokens: expected {total_tokens:,} from {stdlib_dir or 'the stdlib'}, "
            f"found {len(tokens):,}; pass input_bin to train on your own llm.c shards"
        )
    return tokens


def cache_dir() -> pathlib.Path:
    """$JAXTRAIN_CACHE, else $XDG_CACHE_HOME/jaxtrain, else ~/.cache/jaxtrain."""
    if os.environ.get("JAXTRAIN_CACHE"):
        return pathlib.Path(os.environ["JAXTRAIN_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(xdg) / "jaxtrain"


def _write_atomically(path: pathlib.Path, tokens: np.ndarray, family: str) -> None:
    # Several processes may build at once (one per host); each writes a private temp file and renames,
    # so a reader never sees a partial shard and the identical results simply replace each other.
    from llmc_io.shards import write_shard

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        write_shard(tmp, tokens, kind=family)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a shared cache should stay readable
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def for_family(tokens: np.ndarray, family: str) -> np.ndarray:
    """The GPT-2 corpus `tokens` as `family`'s ids: the same byte ids, its document start."""
    if family == "gpt2":
        return tokens
    out = tokens.astype(np.uint32)
    out[tokens == EOT_TOKEN] = DOCUMENT_START[family]
    return out


def ensure_default_corpus(
    directory: str | os.PathLike | None = None, report=None, family: str = "gpt2"
) -> tuple[str, str]:
    """(train_path, val_path) of the default corpus shards, building them if absent.

    Files are named after the Python version and CORPUS_VERSION, since both change the contents.
    `report` (e.g. print) is told when a build starts and ends: it takes seconds, once.
    """
    directory = pathlib.Path(directory) if directory is not None else cache_dir()
    stem = "stdlib_py{}.{}.{}_v{}".format(*sys.version_info[:3], CORPUS_VERSION)
    if family != "gpt2":
        stem += f"_{family}"
    train_path = directory / f"{stem}_train.bin"
    val_path = directory / f"{stem}_val.bin"
    if not (train_path.exists() and val_path.exists()):
        began = time.perf_counter()
        if report:
            report(f"data: building the built-in corpus from the stdlib's source into {directory} (once)...")
        directory.mkdir(parents=True, exist_ok=True)
        tokens = for_family(build_tokens(), family)
        _write_atomically(train_path, tokens[:-VAL_TOKENS], family)
        _write_atomically(val_path, tokens[-VAL_TOKENS:], family)
        if report:
            report(f'data: built {len(tokens):,} tokens in {time.perf_counter() - began:.1f} s')
    return str(train_path), str(val_path)


LLAMA3_VOCAB_SIZE = 128256
# LLaMA-3's special tokens as its tokenizer spells them (the ones the corpus and samples use).
LLAMA3_SPECIAL_PIECES = {128000: b'<|begin_of_text|>', 128001: b'<|end_of_text|>'}

# What an id outside the corpus's alphabet prints as: U+FFFD, in UTF-8.
UNKNOWN_PIECE = '\ufffd'.encode()


def default_corpus_tokenizer(family: str = 'gpt2') -> Tokenizer:
    """The family's byte-level ids and special tokens, from the corpus's own byte -> id mapping;
    its eot_token is the id samples start from (GPT-2's EOT, LLaMA-3's <|begin_of_text|>)."""
    pieces = [UNKNOWN_PIECE] * (GPT2_VOCAB_SIZE if family == 'gpt2' else LLAMA3_VOCAB_SIZE)
    for token_id, byte in enumerate(TOKEN_TO_BYTE.tolist()):
        pieces[token_id] = bytes([byte])
    if family == 'gpt2':
        pieces[EOT_TOKEN] = b'<|endoftext|>'
    else:
        for token_id, piece in LLAMA3_SPECIAL_PIECES.items():
            pieces[token_id] = piece
    start = DOCUMENT_START[family]
    return Tokenizer(tuple(pieces), start, path=f'built-in byte-level {family} tokenizer (default corpus)')


def builtin_tokenizer_for(vocab_size: int) -> Tokenizer | None:
    """The built-in tokenizer of the family with this vocabulary size, or None."""
    family = {GPT2_VOCAB_SIZE: 'gpt2', LLAMA3_VOCAB_SIZE: 'llama3'}.get(vocab_size)
    return default_corpus_tokenizer(family) if family else None


def load_run_tokenizer(tokenizer_bin: str, tokenizer: str, family: str, vocab_size: int):
    """The tokenizer to decode a model of `vocab_size` ids with, or None when there is none to take.

    llm.c's file must cover the vocabulary (llm.c and InfiniTrain index it by id); a BPE tokenizer
    may be smaller than a model's padded or named vocabulary: ids it lacks decode to U+FFFD."""
    if tokenizer_bin and tokenizer:
        raise ValueError(
            f'tokenizer: expected one of --tokenizer and --tokenizer_bin, found both ({tokenizer} and '
            f'{tokenizer_bin}); pass one'
        )
    if tokenizer:
        from llmc_io.text.bpe import load_text_tokenizer

        return load_text_tokenizer(tokenizer, family)
    if tokenizer_bin:
        import llmc_io

        found = llmc_io.read_tokenizer(tokenizer_bin)
        if found.vocab_size < vocab_size:
            raise ValueError(
                f'--tokenizer_bin: {tokenizer_bin}: expected at least {vocab_size} tokens (the '
                f"model's vocab_size), found {found.vocab_size}"
            )
        return found

    return builtin_tokenizer_for(vocab_size)


def encode_prompt(tokenizer, text: str) -> list[int]:
    """A BPE tokenizer's own encoding; llm.c's file has only pieces, so the longest match over them."""
    if hasattr(tokenizer, 'encode_batch'):
        return tokenizer.encode(text)
    return tokenizer.encode_longest_match(text.encode())
