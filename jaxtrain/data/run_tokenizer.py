"""The tokenizer that turns a run's token ids into text (samples, `jaxtrain.generate`) and back.

One of: llm.c's tokenizer file (`tokenizer_bin`, decode only: it holds no merges), a BPE
tokenizer (`tokenizer`: a Hugging Face tokenizer.json or a tiktoken BPE file, llmc_io/text_tokenizer.py),
or, for GPT-2's or LLaMA-3's vocabulary without either, the built-in byte-level tokenizer of the
default corpus.
"""

from __future__ import annotations


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
        from llmc_io.text_tokenizer import load_text_tokenizer

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
    from jaxtrain.data.default_tokenizer import builtin_tokenizer_for

    return builtin_tokenizer_for(vocab_size)


def encode_prompt(tokenizer, text: str) -> list[int]:
    """A BPE tokenizer's own encoding; llm.c's file has only pieces, so the longest match over them."""
    if hasattr(tokenizer, 'encode_batch'):
        return tokenizer.encode(text)
    return tokenizer.encode_longest_match(text.encode())
