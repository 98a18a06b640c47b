"""The tokenizer that turns a run's token ids into text (samples, `jaxtrain.generate`) and back.

One of: llm.c's tokenizer file (`tokenizer_bin`, decode only: it holds no merges), a BPE
tokenizer (`tokenizer`: a Hugging Face tokenizer.json or a tiktoken BPE file, llmc_io/text/bpe.py),
or, for GPT-2's or LLaMA-3's vocabulary without either, the built-in byte-level tokenizer of the
default corpus.

The decoder of the built-in corpus, with no file and no download.

The default corpus (default_corpus.py) is GPT-2 token ids of single bytes, plus EOT before each
file. Its byte -> id table is therefore the whole vocabulary it uses, and inverting it gives an
llm.c-style tokenizer (llmc_io.Tokenizer) with GPT-2's 50257 ids: ids 0..255 are GPT-2's own
single-byte tokens, 50256 is `<|endoftext|>`, and the BPE merges (ids 256..50255), which the
corpus never holds, decode to U+FFFD, so that an untrained model's sample still prints.

LLaMA-3's built-in corpus holds the same byte ids (its tokenizer keeps GPT-2's order for the
first 256) and <|begin_of_text|> before each file, so the same table over LLaMA-3's 128256 ids
decodes it; there the start token is <|begin_of_text|>, where the corpus's documents start.
"""

from __future__ import annotations

from llmc_io.text.tokenizer import GPT2_VOCAB_SIZE, Tokenizer
from jaxtrain.data.default_corpus import DOCUMENT_START, EOT_TOKEN, TOKEN_TO_BYTE


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
    from jaxtrain.data.tokenizer import builtin_tokenizer_for

    return builtin_tokenizer_for(vocab_size)


def encode_prompt(tokenizer, text: str) -> list[int]:
    """A BPE tokenizer's own encoding; llm.c's file has only pieces, so the longest match over them."""
    if hasattr(tokenizer, 'encode_batch'):
        return tokenizer.encode(text)
    return tokenizer.encode_longest_match(text.encode())
