"""`python -m llmc_io shard`: text, token ids or shards -> llm.c token shards of either family.

    python -m llmc_io shard book.txt notes.txt --family llama3 --output data/mine
    python -m llmc_io shard book.txt --family gpt2 --output data/mine --tokenizer tokenizer.json
    python -m llmc_io shard 'fineweb/*.parquet' --family llama3 --output data/fw --tokenizer tokenizer.model
    python -m llmc_io shard ids.npy --from ids --family gpt2 --output data/mine
    python -m llmc_io shard 'gpt2_train_*.bin' --from shard --family llama3 --output data/wide

--from text: each text file is one document (or one per blank-line-separated section with
  --split_blank_lines, as llm.c's tinyshakespeare.py), each line of a .jsonl file and each row
  of a .parquet file one (their --text_field). Each document follows the family's
  document-start id (GPT-2 <|endoftext|>, LLaMA-3 <|begin_of_text|>), as llm.c's dev/data
  scripts delimit documents. With --tokenizer (a Hugging Face tokenizer.json or a tiktoken
  BPE file such as LLaMA-3's tokenizer.model) the text is encoded by that BPE; without one,
  byte-level (one id per byte, in the order both families' tokenizers give their first 256
  ids).
--from ids: .npy arrays of integer ids, taken as they are.
--from shard: llm.c shards of either family, their ids taken as they are: uint16 -> uint32
  (gpt2 -> llama3 magic) or back, which refuses ids above 65535 rather than wrap them.

The tokens of all inputs, in the order given, are cut into shards of --shard_tokens as
llm.c's fineweb.py names them: OUTPUT_val_000000.bin first when --val_tokens > 0 (the
first that many tokens), then OUTPUT_train_000001.bin, ... (OUTPUT_train_000000.bin, ...
without a validation shard). Nothing is written when an input is refused.

A prefix that already has shards (any split, any number) is refused; with --force all of them
are removed before the new ones are written, so OUTPUT_train_*.bin never mixes two corpora. An
input that is one of those shards is refused, --force or not.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import numpy as np
import json

from llmc_io import header as hdr
from llmc_io.text.bpe import encode_documents
from llmc_io.errors import LLMCFormatError
from llmc_io.output_file import refuse_inputs
from llmc_io.shards import MAX_TOKENS, SHARD_KINDS, read_shard, write_shard


SOURCES = ("text", "ids", "shard")
DEFAULT_SHARD_TOKENS = 10**8  # llm.c's fineweb.py shard_size
ENCODE_BATCH = 1024  # documents per call into the tokenizer library, which encodes a batch in parallel


def add_parser(commands, parents) -> None:
    shard = commands.add_parser(
        "shard",
        parents=parents,
        help="make token shards from text, ids or other shards (u16 <-> u32)",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shard.add_argument("inputs", nargs="+", metavar="INPUT", help="files or globs, read in the order given")
    shard.add_argument("--output", required=True, help="path prefix of the shards, e.g. data/mine")
    shard.add_argument("--family", choices=tuple(SHARD_KINDS), required=True, help="shard kind to write")
    shard.add_argument("--from", dest="source", choices=SOURCES, default="text", help="what the inputs are")
    shard.add_argument(
        "--shard_tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard (default 10^8)"
    )
    shard.add_argument("--val_tokens", type=int, default=0, help="first N tokens to a val shard (default 0)")
    shard.add_argument(
        "--tokenizer",
        default="",
        metavar="FILE",
        help="--from text: a Hugging Face tokenizer.json or a tiktoken BPE file to encode with "
        "(default: byte-level ids)",
    )
    shard.add_argument(
        "--text_field",
        default="text",
        help="--from text: the field of .jsonl rows / column of .parquet (text)",
    )
    shard.add_argument(
        "--split_blank_lines",
        action="store_true",
        help="--from text: each blank-line-separated section of a text file is a document (llm.c's "
        "tinyshakespeare.py)",
    )
    shard.add_argument(
        "--force",
        action="store_true",
        help="remove the shards --output already has (all of them, any number) and write the new ones; "
        "never an INPUT",
    )


def _expand(patterns) -> list[str]:
    paths = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not found:
            raise LLMCFormatError(pattern, "INPUT", "files matching the glob", "none")
        for path in found:
            if not os.path.isfile(path):
                raise LLMCFormatError(
                    path, "INPUT", "a file", "a directory" if os.path.isdir(path) else "nothing"
                )
        paths += found
    return paths


def _ids_of(path: str) -> np.ndarray:
    try:
        ids = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as error:
        raise LLMCFormatError(path, "content", "a .npy array of token ids", f"unreadable ({error})") from None
    if ids.dtype.kind not in "iu":
        raise LLMCFormatError(path, "dtype", "an integer array", str(ids.dtype))
    return ids.reshape(-1)


def _byte_level_text(path: str, family: str, text_field: str, split_blank_lines: bool) -> np.ndarray:
    if path.endswith((".jsonl", ".parquet")):
        documents = [d.encode() for d in read_documents(path, text_field)]
    else:
        with open(path, "rb") as f:
            data = f.read()
        # Sections of bytes, not of text: byte-level ids need no UTF-8.
        sections = split_sections(data.decode("latin-1")) if split_blank_lines else None
        documents = [s.encode("latin-1") for s in sections] if sections else [data]
    return encode_documents(documents, family).astype(np.int64)


def _bpe_text(path: str, tokenizer, text_field: str, split_blank_lines: bool) -> np.ndarray:
    documents = read_documents(path, text_field, split_blank_lines)
    start = tokenizer.document_start
    pieces = []
    for at in range(0, len(documents), ENCODE_BATCH):
        for ids in tokenizer.encode_batch(documents[at : at + ENCODE_BATCH]):
            pieces += [np.array([start], np.int64), np.asarray(ids, np.int64)]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


def read_tokens(
    paths,
    source: str,
    family: str,
    tokenizer: str = "",
    text_field: str = "text",
    split_blank_lines: bool = False,
) -> np.ndarray:
    """All tokens of the inputs as int64, checked to fit the family's shard dtype."""
    if tokenizer and source != "text":
        raise LLMCFormatError(
            tokenizer, "--tokenizer", "--from text (ids and shards are tokens already)", f"--from {source}"
        )
    if source == "text" and tokenizer:
        from llmc_io.text.bpe import load_text_tokenizer

        bpe = load_text_tokenizer(tokenizer, family)
        parts = [_bpe_text(path, bpe, text_field, split_blank_lines) for path in paths]
    elif source == "text":
        parts = [_byte_level_text(path, family, text_field, split_blank_lines) for path in paths]
    elif source == "ids":
        parts = [_ids_of(path) for path in paths]
    else:
        parts = [np.asarray(read_shard(path)) for path in paths]
    tokens = np.concatenate([p.astype(np.int64) for p in parts]) if parts else np.zeros(0, np.int64)
    limit = int(np.iinfo(SHARD_KINDS[family].dtype).max)
    for path, part in zip(paths, parts):
        if part.size and (int(part.min()) < 0 or int(part.max()) > limit):
            at = int(np.flatnonzero((part < 0) | (part > limit))[0])
            raise LLMCFormatError(
                path,
                f"token {at}",
                f"an id in [0, {limit}] for a {family} shard",
                int(part[at]),
                "LLaMA-3 ids need --family llama3" if family == "gpt2" else None,
            )
    return tokens


def shard_names(output: str, count: int, has_val: bool) -> list[str]:
    names = []
    for index in range(count):
        split = "val" if has_val and index == 0 else "train"
        names.append(f"{output}_{split}_{index:06d}.bin")
    return names


def existing_shards(output: str) -> list[str]:
    """The shards of the prefix `output` on disk, of either split and any number."""
    directory = os.path.dirname(output)
    name = re.compile(re.escape(os.path.basename(output)) + r"_(?:train|val)_\d{6}\.bin")
    if not os.path.isdir(directory or "."):
        return []
    return sorted(os.path.join(directory, n) for n in os.listdir(directory or ".") if name.fullmatch(n))


def _check_output(output: str, paths: list[str], force: bool) -> list[str]:
    """The old shards to remove before writing: none, or (with force) all of the prefix's."""
    old = existing_shards(output)
    for shard in old:
        refuse_inputs(shard, paths, "--output")
    if old and not force:
        shown = ", ".join(os.path.basename(p) for p in old[:3]) + (", ..." if len(old) > 3 else "")
        raise LLMCFormatError(
            output,
            "--output",
            "a prefix with no shards yet",
            f"{len(old)} ({shown})",
            "choose another --output, or pass --force to remove them all and write the new corpus",
        )
    return old


def make_shards(
    inputs,
    output: str,
    family: str,
    source: str,
    shard_tokens: int,
    val_tokens: int,
    tokenizer: str = "",
    text_field: str = "text",
    split_blank_lines: bool = False,
    force: bool = False,
) -> list[str]:
    """Writes the shards; returns their paths."""
    if not 0 < shard_tokens <= MAX_TOKENS:
        raise LLMCFormatError(output, "--shard_tokens", f"between 1 and {MAX_TOKENS:,}", shard_tokens)
    paths = _expand(inputs)
    old = _check_output(output, paths, force)
    tokens = read_tokens(paths, source, family, tokenizer, text_field, split_blank_lines)
    if tokens.size == 0:
        raise LLMCFormatError(output, "tokens", "at least one input token", 0)
    if val_tokens < 0 or val_tokens >= tokens.size:
        raise LLMCFormatError(
            output, "--val_tokens", f"0 or fewer than the {tokens.size:,} input tokens", val_tokens
        )
    pieces = [tokens[:val_tokens]] if val_tokens else []
    train = tokens[val_tokens:]
    pieces += [train[i : i + shard_tokens] for i in range(0, train.size, shard_tokens)]
    names = shard_names(output, len(pieces), bool(val_tokens))
    directory = os.path.dirname(output)
    if directory:
        os.makedirs(directory, exist_ok=True)
    for path in old:  # only now that every input was read and accepted
        os.remove(path)
    for name, piece in zip(names, pieces):
        write_shard(name, piece.astype(SHARD_KINDS[family].dtype), kind=family)
    return names


def run(args) -> None:
    names = make_shards(
        args.inputs,
        args.output,
        args.family,
        args.source,
        args.shard_tokens,
        args.val_tokens,
        args.tokenizer,
        args.text_field,
        args.split_blank_lines,
        args.force,
    )
    kind = SHARD_KINDS[args.family]
    for name in names:
        count = (os.path.getsize(name) - hdr.HEADER_BYTES) // kind.dtype.itemsize
        print(f"wrote {name}: {args.family} shard (magic {kind.magic}, {kind.dtype.name}), {count:,} tokens")


BLANK_LINE = "\n\n"


# The documents of text inputs: what llm.c's data scripts call a document.
#
# - a text file is one document, or, with split_blank_lines, one per "\n\n"-separated section, each but
#   the last keeping its "\n\n" (llm.c dev/data/tinyshakespeare.py at d36f0e6 does so "for backwards
#   compatibility": it meant to drop them);
# - a `.jsonl` file holds one JSON object per line, the document in its `text_field`
#   (FineWeb's rows, as llm.c's fineweb.py reads them through `datasets`);
# - a `.parquet` file (FineWeb's own files) holds one document per row of column `text_field`, read
#   with pyarrow when it is installed.


def _decode(path: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise LLMCFormatError(
            path,
            f"byte {error.start}",
            "UTF-8 text",
            repr(data[error.start : error.start + 4]),
            "a BPE tokenizer reads text; without --tokenizer the bytes are taken as they are",
        ) from None


def split_sections(text: str) -> list[str]:
    sections = text.split(BLANK_LINE)
    return [s + BLANK_LINE if i != len(sections) - 1 else s for i, s in enumerate(sections)]


def _jsonl(path: str, text_field: str) -> list[str]:
    documents = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise LLMCFormatError(path, f"line {number}", "one JSON object", repr(line[:40])) from None
            if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
                found = (
                    "no such key"
                    if not isinstance(row, dict) or text_field not in row
                    else type(row[text_field]).__name__
                )
                raise LLMCFormatError(
                    path,
                    f"line {number} field {text_field!r}",
                    "a string",
                    found,
                    "pick the field with --text_field",
                )
            documents.append(row[text_field])
    return documents


def _parquet(path: str, text_field: str) -> list[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise LLMCFormatError(
            path, "reader", "pyarrow to read parquet", "it is not installed", "pip install pyarrow"
        ) from None
    try:
        table = pq.read_table(path, columns=[text_field])
    except Exception as error:  # noqa: BLE001  pyarrow's errors name the missing column or the bad file
        raise LLMCFormatError(
            path, f"column {text_field!r}", "a parquet file with that column", str(error).splitlines()[0]
        ) from None
    return [str(value) for value in table.column(text_field).to_pylist() if value is not None]


def read_documents(path: str, text_field: str = "text", split_blank_lines: bool = False) -> list[str]:
    """The documents of one input file, by its extension (.jsonl, .parquet, else text)."""
    if path.endswith(".jsonl"):
        return _jsonl(path, text_field)
    if path.endswith(".parquet"):
        return _parquet(path, text_field)
    with open(path, "rb") as f:
        text = _decode(path, f.read())
    return split_sections(text) if split_blank_lines else [text]
