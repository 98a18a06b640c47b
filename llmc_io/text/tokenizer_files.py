"""Tokenizer files made from other tokenizer files, offline: llm.c's tokenizer file from a BPE
tokenizer (`python -m llmc_io tokenizer`), GPT-2's tokenizer.json from OpenAI's two files
(`python -m llmc_io gpt2-tokenizer`), and the tokenizer files of an exported Hugging Face folder.
Each command's own description is its `..._COMMAND` text below, what its --help prints.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from llmc_io.atomic_file import write_bytes_atomically, write_text_atomically
from llmc_io.errors import LLMCFormatError
from llmc_io.output_file import check_new_file
from llmc_io.text.bpe import (
    DOCUMENT_START,
    END_OF_TEXT,
    FAMILIES,
    GPT2_ENDOFTEXT,
    GPT2_SPLIT,
    LLAMA3_SPLIT,
    HFTokenizer,
    TextTokenizer,
    bytes_to_unicode,
    load_text_tokenizer,
    read_tiktoken_ranks,
)
from llmc_io.text.tokenizer import GPT2_TOKENIZER_MAGIC, LLAMA3_TOKENIZER_MAGIC, write_tokenizer

# --- `python -m llmc_io tokenizer` -----------------------------------------------------------------

TOKENIZER_COMMAND = """\
`python -m llmc_io tokenizer`: llm.c's tokenizer file from a BPE tokenizer, so that llm.c and
InfiniTrain print the same text for the same ids.

    python -m llmc_io tokenizer tokenizer.json --family gpt2 --output gpt2_tokenizer.bin
    python -m llmc_io tokenizer tokenizer.model --family llama3 --output llama3_tokenizer.bin

GPT-2 writes llm.c's file (magic 20240328, version 2, as llm.c's train_gpt2.py write_tokenizer);
LLaMA-3 writes the variant InfiniTrain reads (magic 20240801, version 2; llm.c has no writer for
it). Entry i is the bytes of id i (a special token's are its name, as tiktoken's
decode_bytes gives them); the EOT slot is <|endoftext|> or <|end_of_text|>.
"""

MAGIC = {"gpt2": GPT2_TOKENIZER_MAGIC, "llama3": LLAMA3_TOKENIZER_MAGIC}


def add_tokenizer_parser(commands, parents) -> None:
    command = commands.add_parser(
        "tokenizer",
        parents=parents,
        help="write llm.c's tokenizer file from a tokenizer.json or tiktoken BPE file",
        description=TOKENIZER_COMMAND.split("\n\n", 1)[1],
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


def run_tokenizer(args) -> None:
    check_new_file(args.output, args.force, [args.input], flag="--output")
    tokenizer = load_text_tokenizer(args.input, args.family)
    count = write_llmc_tokenizer(tokenizer, args.output)
    print(
        f"wrote {args.output}: {args.family} tokenizer file (magic {MAGIC[args.family]}, version 2), "
        f"{count:,} tokens, EOT {tokenizer.eot_token}, from the {tokenizer.kind} {args.input}"
    )


# --- `python -m llmc_io gpt2-tokenizer` ------------------------------------------------------------

GPT2_TOKENIZER_COMMAND = """\
`python -m llmc_io gpt2-tokenizer encoder.json vocab.bpe --output tokenizer.json`: GPT-2's
Hugging Face tokenizer.json from the two files OpenAI published with GPT-2, offline.

encoder.json maps each token, spelled in GPT-2's byte -> character table (openai/gpt-2's
bytes_to_unicode), to its id; vocab.bpe lists the merges in rank order, one pair a line after a
`#version` line. They are what openai/gpt-2's download script fetches, and what a Hugging Face
gpt2 folder holds as vocab.json and merges.txt. The tokenizer.json is the byte-level BPE of
Hugging Face's own gpt2 one: GPT-2's split pattern (ByteLevel's), no prefix space, and
<|endoftext|> a special token.
"""


def add_gpt2_tokenizer_parser(commands, parents) -> None:
    command = commands.add_parser(
        "gpt2-tokenizer",
        parents=parents,
        help="write GPT-2's tokenizer.json from its encoder.json and vocab.bpe, offline",
        description=GPT2_TOKENIZER_COMMAND.split("\n\n", 1)[1],
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


def run_gpt2_tokenizer(args) -> None:
    check_new_file(args.output, args.force, [args.encoder, args.merges], flag="--output")
    encoder = read_encoder(args.encoder)
    merges = read_merges(args.merges, encoder)
    write_text_atomically(args.output, gpt2_tokenizer_json(encoder, merges))
    eot = f", EOT {encoder[GPT2_ENDOFTEXT]}" if GPT2_ENDOFTEXT in encoder else ", no <|endoftext|>"
    print(f"wrote {args.output}: byte-level BPE, {len(encoder):,} tokens, {len(merges):,} merges{eot}")


# --- an exported Hugging Face folder's tokenizer files ---------------------------------------------
# A BPE tokenizer as Hugging Face folder files (tokenizer.json, tokenizer_config.json), written
# beside an exported model's config.json so that `AutoTokenizer.from_pretrained(folder)` decodes
# the model's ids as the run encoded its data.
#
# A tokenizer.json is copied as it is. A tiktoken BPE file is converted: its ranks become a
# byte-level BPE vocabulary (tokens spelled in GPT-2's byte -> character table), and its merges
# are every split of a token into two known tokens, ordered by the merged token's rank, then the
# pieces' ranks (the conversion transformers' TikTokenConverter makes); the family's split
# pattern and special tokens come along.


def _tiktoken_as_tokenizer_json(tokenizer: TextTokenizer) -> str:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    ranks = read_tiktoken_ranks(tokenizer.path)
    chars = bytes_to_unicode()

    def spell(piece: bytes) -> str:
        return "".join(chars[b] for b in piece)

    merges = []
    for piece, rank in ranks.items():
        splits = [
            (piece[:i], piece[i:]) for i in range(1, len(piece)) if piece[:i] in ranks and piece[i:] in ranks
        ]
        merges += sorted(((rank, ranks[a], ranks[b]), a, b) for a, b in splits)
    merges.sort()
    vocab = {spell(piece): rank for piece, rank in ranks.items()}
    bpe = models.BPE(vocab=vocab, merges=[(spell(a), spell(b)) for _, a, b in merges])
    converted = Tokenizer(bpe)
    pattern = GPT2_SPLIT if tokenizer.family == "gpt2" else LLAMA3_SPLIT
    converted.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    converted.decoder = decoders.ByteLevel()
    specials = sorted(tokenizer.special_tokens.items(), key=lambda item: item[1])
    converted.add_special_tokens([AddedToken(name, special=True, normalized=False) for name, _ in specials])
    return converted.to_str(pretty=True)


def write_hf_tokenizer_files(tokenizer: TextTokenizer, folder, model_max_length: int) -> list[str]:
    """Writes tokenizer.json and tokenizer_config.json into `folder`; returns their paths."""
    folder = Path(folder)
    target = folder / "tokenizer.json"
    if isinstance(tokenizer, HFTokenizer):
        write_bytes_atomically(target, Path(tokenizer.path).read_bytes())
    else:
        write_text_atomically(target, _tiktoken_as_tokenizer_json(tokenizer))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": DOCUMENT_START[tokenizer.family],
        "eos_token": END_OF_TEXT[tokenizer.family],
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    write_text_atomically(folder / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
    return [os.fspath(target), os.fspath(folder / "tokenizer_config.json")]
