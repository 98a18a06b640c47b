"""`python -m llmc_io gpt2-tokenizer encoder.json vocab.bpe --output tokenizer.json`: the file the
`tokenizers` library loads encodes as GPT-2's own encoder.py does, on a small vocabulary made here
in GPT-2's two file formats (the real ones are GPT-2's 50,257 tokens in the same formats)."""

import json

import pytest
import regex

from llmc_io.__main__ import main
from text_tokenizers import gpt2_bytes_to_unicode

# openai/gpt-2 src/encoder.py, the reference this test encodes with.
GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
MERGES = [('Ġ', 't'), ('h', 'e'), ('Ġt', 'he'), ('l', 'l'), ('e', 'll'), ('h', 'ell'), ('Ġ', 's'), ('1', '2')]
TEXTS = ['hello the hell, shell 12 ll!', "  the\n\nthem's 121 héllo\t end  ", 'the']


def reference_encode(text: str, encoder: dict[str, int]) -> list[int]:
    """encoder.py's Encoder.encode: the pattern's pieces, each merged by lowest rank first."""
    ranks = {pair: rank for rank, pair in enumerate(MERGES)}
    spell = gpt2_bytes_to_unicode()
    ids = []
    for piece in GPT2_PATTERN.findall(text):
        word = [spell[b] for b in piece.encode('utf-8')]
        while len(word) > 1:
            pair = min(zip(word, word[1:]), key=lambda p: ranks.get(p, float('inf')))
            if pair not in ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == pair:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        ids += [encoder[token] for token in word]
    return ids


@pytest.fixture
def gpt2_files(tmp_path):
    tokens = list(gpt2_bytes_to_unicode().values()) + [a + b for a, b in MERGES] + ['<|endoftext|>']
    encoder = {token: i for i, token in enumerate(tokens)}
    (tmp_path / 'encoder.json').write_text(json.dumps(encoder))
    (tmp_path / 'vocab.bpe').write_text('#version: 0.2\n' + ''.join(f'{a} {b}\n' for a, b in MERGES))
    return tmp_path, encoder


def test_the_tokenizer_json_encodes_as_gpt2s_encoder_py(gpt2_files, capsys):
    import tokenizers

    folder, encoder = gpt2_files
    output = folder / 'tokenizer.json'
    args = [
        'gpt2-tokenizer',
        str(folder / 'encoder.json'),
        str(folder / 'vocab.bpe'),
        '--output',
        str(output),
    ]
    assert main(args) == 0
    assert f'{len(encoder)} tokens, {len(MERGES)} merges, EOT {len(encoder) - 1}' in capsys.readouterr().out
    tokenizer = tokenizers.Tokenizer.from_file(str(output))
    for text in TEXTS:
        ids = tokenizer.encode(text).ids
        assert ids == reference_encode(text, encoder), text
        assert tokenizer.decode(ids) == text
    assert reference_encode(' the', encoder) == [encoder['Ġthe']]  # the merges did merge
    assert tokenizer.encode('a<|endoftext|>').ids == [encoder['a'], encoder['<|endoftext|>']]

    # An existing output is replaced only with --force.
    before = output.read_bytes()
    output.write_text('mine')
    assert main(args) == 2
    assert '--force' in capsys.readouterr().err and output.read_text() == 'mine'
    assert main([*args, '--force']) == 0 and output.read_bytes() == before


def test_a_merge_of_unknown_tokens_is_one_line_naming_the_line(gpt2_files, capsys):
    folder, _ = gpt2_files
    (folder / 'vocab.bpe').write_text('#version: 0.2\nh e\nq zz\n')
    code = main(['gpt2-tokenizer', str(folder / 'encoder.json'), str(folder / 'vocab.bpe'), '--output', 'x'])
    err = capsys.readouterr().err
    assert code == 2 and err.count('\n') == 1
    assert "vocab.bpe: line 3: expected a merge of tokens encoder.json holds" in err and "'zz'" in err
