"""The built-in decoder of the default corpus, against GPT-2 vocabulary facts from encoder.json
(the byte tokens are ids 0..255: '!' is 0, 'Ġ' (space) is 220, 'Ċ' (newline) is 198, 'Ā' (byte 0) is
188), LLaMA-3's special ids (128000 <|begin_of_text|>, 128001 <|end_of_text|>, from its
tokenizer_config.json) and against the corpus's own text in either family."""

import pathlib

import numpy as np

from jaxtrain.data import default_corpus
from jaxtrain.data.default_corpus import builtin_tokenizer_for, default_corpus_tokenizer
from llmc_io.text.bpe import encode_documents


def test_gpt2_facts_and_eot():
    tok = default_corpus_tokenizer()
    assert tok.vocab_size == 50257 and tok.eot_token == 50256
    assert tok.decode_bytes([0, 220, 198, 188, 50256]) == b'! \n\x00<|endoftext|>'
    # A BPE merge the corpus never holds prints as U+FFFD rather than failing.
    assert tok.decode([464]) == '\ufffd'


def test_decodes_the_corpus_back_to_its_source():
    source = sorted(pathlib.Path(np.__file__).parent.rglob('*.py'))[0].read_bytes()
    tokens = np.concatenate([[default_corpus.EOT_TOKEN], default_corpus.encode_bytes(source)])
    assert default_corpus_tokenizer().decode_bytes(tokens) == b'<|endoftext|>' + source


def test_llama3_facts_and_its_corpus_decodes_back_to_its_source():
    tok = default_corpus_tokenizer('llama3')
    assert tok.vocab_size == 128256 and tok.eot_token == 128000  # samples start where documents do
    assert tok.decode_bytes([128000, 0, 220, 198, 128001]) == b'<|begin_of_text|>! \n<|end_of_text|>'
    assert tok.decode([464]) == '\ufffd'
    sources = [p.read_bytes() for p in sorted(pathlib.Path(np.__file__).parent.rglob('*.py'))[:2]]
    tokens = encode_documents(sources, 'llama3')
    assert tokens.dtype == np.uint32
    assert tok.decode_bytes(tokens) == b''.join(b'<|begin_of_text|>' + s for s in sources)


def test_builtin_tokenizer_by_vocabulary_size():
    assert builtin_tokenizer_for(50257).eot_token == 50256
    assert builtin_tokenizer_for(128256).eot_token == 128000
    assert builtin_tokenizer_for(512) is None
