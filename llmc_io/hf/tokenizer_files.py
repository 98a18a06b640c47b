"""A BPE tokenizer as Hugging Face folder files (tokenizer.json, tokenizer_config.json), written
beside an exported model's config.json so that `AutoTokenizer.from_pretrained(folder)` decodes
the model's ids as the run encoded its data.

A tokenizer.json is copied as it is. A tiktoken BPE file is converted: its ranks become a
byte-level BPE vocabulary (tokens spelled in GPT-2's byte -> character table), and its merges
are every split of a token into two known tokens, ordered by the merged token's rank, then the
pieces' ranks (the conversion transformers' TikTokenConverter makes); the family's split
pattern and special tokens come along.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from llmc_io.atomic_file import write_bytes_atomically, write_text_atomically
from llmc_io.text.bpe import (
    DOCUMENT_START,
    END_OF_TEXT,
    GPT2_SPLIT,
    LLAMA3_SPLIT,
    HFTokenizer,
    TextTokenizer,
    bytes_to_unicode,
    read_tiktoken_ranks,
)


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
