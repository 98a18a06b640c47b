"""The built-in decoder of the default corpus, against GPT-2 vocabulary facts from encoder.json
(the byte tokens are ids 0..255: '!' is 0, 'Ġ' (space) is 220, 'Ċ' (newline) is 198, 'Ā' (byte 0) is
188) and against the corpus's own text."""

import pathlib

import numpy as np

from jaxtrain.data import default_corpus
from jaxtrain.data.default_tokenizer import default_corpus_tokenizer


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
