"""`python -m llmc_io gpt2-tokenizer encoder.json vocab.bpe --output tokenizer.json`: GPT-2's
Hugging Face tokenizer.json from the two files OpenAI published with GPT-2, offline.

encoder.json maps each token, spelled in GPT-2's byte -> character table (openai/gpt-2's
bytes_to_unicode), to its id; vocab.bpe lists the merges in rank order, one pair a line after a
`#version` line. They are what openai/gpt-2's download script fetches, and what a Hugging Face
gpt2 folder holds as vocab.json and merges.txt. The tokenizer.json is the byte-level BPE of
Hugging Face's own gpt2 one: GPT-2's split pattern (ByteLevel's), no prefix space, and
<|endoftext|> a special token.
"""

from __future__ import annotations

import argparse
import json

from llmc_io.atomic_file import write_text_atomically
from llmc_io.errors import LLMCFormatError
from llmc_io.output_file import check_new_file
from llmc_io.text.bpe import GPT2_ENDOFTEXT


def add_parser(commands, parents) -> None:
    command = commands.add_parser(
        "gpt2-tokenizer",
        parents=parents,
        help="write GPT-2's tokenizer.json from its encoder.json and vocab.bpe, offline",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("encoder", metavar="ENCODER_JSON", help="GPT-2's encoder.json (or vocab.json)")
    command.add_argument("merges", metavar="VOCAB_BPE", help="GPT-2's vocab.bpe (or merges.txt)")
    command.add_argument("--output", required=True, help="the tokenizer.json to write")
    command.add_argument(
        "--force", action="store_true", help="replace an existing --output (never an input itself)"
    )


def read_encoder(path) -> dict[str, int]:
    """encoder.json: {token: id}, every id a distinct non-negative integer."""
    try:
        with open(path, encoding="utf-8") as f:
            encoder = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LLMCFormatError(
            path, "encoder", "JSON", f"not JSON ({e})", "pass GPT-2's encoder.json"
        ) from None
    if not isinstance(encoder, dict) or not encoder:
        raise LLMCFormatError(path, "encoder", "an object {token: id}", type(encoder).__name__)
    bad = next(((t, i) for t, i in encoder.items() if type(i) is not int or i < 0), None)
    if bad is not None:
        raise LLMCFormatError(path, f"encoder[{bad[0]!r}]", "a non-negative integer id", repr(bad[1]))
    if len(set(encoder.values())) != len(encoder):
        raise LLMCFormatError(path, "encoder", "a distinct id for every token", "ids used twice")
    return encoder


def read_merges(path, encoder: dict[str, int]) -> list[tuple[str, str]]:
    """vocab.bpe: the merges in rank order, each of two known tokens whose join is known."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    merges = []
    for number, line in enumerate(lines, start=1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        pair = tuple(line.split(" "))
        if len(pair) != 2 or not all(pair):
            raise LLMCFormatError(path, f"line {number}", "two tokens separated by one space", repr(line))
        unknown = next((t for t in (*pair, pair[0] + pair[1]) if t not in encoder), None)
        if unknown is not None:
            raise LLMCFormatError(
                path,
                f"line {number}",
                "a merge of tokens encoder.json holds, into one it holds",
                f"{unknown!r}, which it does not",
                "pass the vocab.bpe published with that encoder.json",
            )
        merges.append(pair)
    return merges


def gpt2_tokenizer_json(encoder: dict[str, int], merges: list[tuple[str, str]]) -> str:
    """The tokenizer.json text, built with the tokenizers library (its own format)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.BPE(vocab=encoder, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.decoder = decoders.ByteLevel()
    if GPT2_ENDOFTEXT in encoder:
        tokenizer.add_special_tokens([AddedToken(GPT2_ENDOFTEXT, special=True)])
    return tokenizer.to_str(pretty=True)


def run(args) -> None:
    check_new_file(args.output, args.force, [args.encoder, args.merges], flag="--output")
    encoder = read_encoder(args.encoder)
    merges = read_merges(args.merges, encoder)
    write_text_atomically(args.output, gpt2_tokenizer_json(encoder, merges))
    eot = f", EOT {encoder[GPT2_ENDOFTEXT]}" if GPT2_ENDOFTEXT in encoder else ", no <|endoftext|>"
    print(f"wrote {args.output}: byte-level BPE, {len(encoder):,} tokens, {len(merges):,} merges{eot}")
