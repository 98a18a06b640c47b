"""The documents of text inputs, for `llmc_io shard`: what llm.c's data scripts call a document.

- a text file is one document, or, with split_blank_lines, one per "\\n\\n"-separated section, each but
  the last keeping its "\\n\\n" (llm.c dev/data/tinyshakespeare.py at d36f0e6 does so "for backwards
  compatibility": it meant to drop them);
- a `.jsonl` file holds one JSON object per line, the document in its `text_field`
  (FineWeb's rows, as llm.c's fineweb.py reads them through `datasets`);
- a `.parquet` file (FineWeb's own files) holds one document per row of column `text_field`, read
  with pyarrow when it is installed.
"""

from __future__ import annotations

import json

from llmc_io.errors import LLMCFormatError

BLANK_LINE = "\n\n"


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
