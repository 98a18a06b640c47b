"""The decoder of the built-in corpus, with no file and no download.

The default corpus (default_corpus.py) is GPT-2 token ids of single bytes, plus EOT before each
file. Its byte -> id table is therefore the whole vocabulary it uses, and inverting it gives an
llm.c-style tokenizer (llmc_io.Tokenizer) with GPT-2's 50257 ids: ids 0..255 are GPT-2's own
single-byte tokens, 50256 is `<|endoftext|>`, and the BPE merges (ids 256..50255), which the
corpus never holds, decode to U+FFFD, so that an untrained model's sample still prints.
"""

from llmc_io.tokenizer import GPT2_VOCAB_SIZE, Tokenizer

from jaxtrain.data.default_corpus import EOT_TOKEN, TOKEN_TO_BYTE

# What an id outside the corpus's alphabet prints as: U+FFFD, in UTF-8.
UNKNOWN_PIECE = '\ufffd'.encode()


def default_corpus_tokenizer() -> Tokenizer:
    """GPT-2's byte-level ids and EOT, from the corpus's own byte -> id mapping."""
    pieces = [UNKNOWN_PIECE] * GPT2_VOCAB_SIZE
    for token_id, byte in enumerate(TOKEN_TO_BYTE.tolist()):
        pieces[token_id] = bytes([byte])
    pieces[EOT_TOKEN] = b'<|endoftext|>'
    return Tokenizer(tuple(pieces), EOT_TOKEN, path='built-in byte-level tokenizer (default corpus)')
