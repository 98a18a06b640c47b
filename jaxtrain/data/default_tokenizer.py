"""The decoder of the built-in corpus, with no file and no download.

The default corpus (default_corpus.py) is GPT-2 token ids of single bytes, plus EOT before each
file. Its byte -> id table is therefore the whole vocabulary it uses, and inverting it gives an
llm.c-style tokenizer (llmc_io.Tokenizer) with GPT-2's 50257 ids: ids 0..255 are GPT-2's own
single-byte tokens, 50256 is `<|endoftext|>`, and the BPE merges (ids 256..50255), which the
corpus never holds, decode to U+FFFD, so that an untrained model's sample still prints.

LLaMA-3's built-in corpus holds the same byte ids (its tokenizer keeps GPT-2's order for the
first 256) and <|begin_of_text|> before each file, so the same table over LLaMA-3's 128256 ids
decodes it; there the start token is <|begin_of_text|>, where the corpus's documents start.
"""

from llmc_io.tokenizer import GPT2_VOCAB_SIZE, Tokenizer

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
