"""`python -m llmc_io tokenizer`: llm.c's tokenizer file from a BPE tokenizer, so that llm.c and
InfiniTrain print the same text for the same ids.

    python -m llmc_io tokenizer tokenizer.json --family gpt2 --output gpt2_tokenizer.bin
    python -m llmc_io tokenizer tokenizer.model --family llama3 --output llama3_tokenizer.bin

GPT-2 writes llm.c's file (magic 20240328, version 2, as llm.c's train_gpt2.py write_tokenizer);
LLaMA-3 writes the variant InfiniTrain reads (magic 20240801, version 2; llm.c has no writer for
it). Entry i is the bytes of id i (a special token's are its name, as tiktoken's
decode_bytes gives them); the EOT slot is <|endoftext|> or <|end_of_text|>.
"""

from __future__ import annotations

import argparse

from llmc_io.output_file import check_new_file
from llmc_io.text.bpe import FAMILIES, TextTokenizer, load_text_tokenizer
from llmc_io.text.tokenizer import GPT2_TOKENIZER_MAGIC, LLAMA3_TOKENIZER_MAGIC, write_tokenizer

MAGIC = {"gpt2": GPT2_TOKENIZER_MAGIC, "llama3": LLAMA3_TOKENIZER_MAGIC}


def add_parser(commands, parents) -> None:
    command = commands.add_parser(
        "tokenizer",
        parents=parents,
        help="write llm.c's tokenizer file from a tokenizer.json or tiktoken BPE file",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument(
        "input", metavar="TOKENIZER", help="a Hugging Face tokenizer.json or a tiktoken BPE file"
    )
    command.add_argument("--family", choices=FAMILIES, required=True, help="whose conventions (EOT, magic)")
    command.add_argument("--output", required=True, help="the llm.c tokenizer file to write")
    command.add_argument(
        "--force", action="store_true", help="replace an existing --output (never TOKENIZER itself)"
    )


def write_llmc_tokenizer(tokenizer: TextTokenizer, path) -> int:
    """Writes `tokenizer` as llm.c's tokenizer file; returns its token count."""
    pieces = tokenizer.all_token_bytes()
    write_tokenizer(path, pieces, tokenizer.eot_token, version=2, magic=MAGIC[tokenizer.family])
    return len(pieces)


def run(args) -> None:
    check_new_file(args.output, args.force, [args.input], flag="--output")
    tokenizer = load_text_tokenizer(args.input, args.family)
    count = write_llmc_tokenizer(tokenizer, args.output)
    print(
        f"wrote {args.output}: {args.family} tokenizer file (magic {MAGIC[args.family]}, version 2), "
        f"{count:,} tokens, EOT {tokenizer.eot_token}, from the {tokenizer.kind} {args.input}"
    )
