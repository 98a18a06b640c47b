"""BPE tokenizers in, llm.c files out: `llmc_io shard --tokenizer` and `llmc_io tokenizer`.

The tokenizers are trained in the test (tests/text_tokenizers.py); the expected ids come from each
library's own encode, called here, and from llm.c's data scripts' delimiting (an EOT or
<|begin_of_text|> before each document; tinyshakespeare.py's sections). Shards and tokenizer files
are read back with NumPy from docs/formats.md §3 and §4.
"""

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import tokenizers

from llmc_io.__main__ import main
from llmc_io.errors import LLMCFormatError

from text_tokenizers import SPECIALS, corpus_text, tiktoken_file_from, train_bpe

SHARD = {'gpt2': (20240520, 1, '<u2'), 'llama3': (20240801, 7, '<u4')}
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DOCS = ['def f(x):\n    return x + 1\n', 'naïve café — “quoted” <|endoftext|> text\n\n\nend']


def read_shard(path, family):
    magic, version, dtype = SHARD[family]
    raw = Path(path).read_bytes()
    header = np.frombuffer(raw[:1024], '<i4')
    tokens = np.frombuffer(raw[1024:], dtype)
    assert header[:3].tolist() == [magic, version, len(tokens)]
    return tokens.tolist()


def read_llmc_tokenizer(path):
    raw = Path(path).read_bytes()
    magic, version, count, eot = np.frombuffer(raw[:16], '<i4').tolist()
    pieces, at = [], 1024
    for _ in range(count):
        pieces.append(raw[at + 1 : at + 1 + raw[at]])
        at += 1 + raw[at]
    assert at == len(raw)
    return magic, version, eot, pieces


@pytest.fixture
def docs(tmp_path):
    paths = []
    for i, text in enumerate(DOCS):
        paths.append(tmp_path / f'doc{i}.txt')
        paths[-1].write_text(text, encoding='utf-8')
    return [str(p) for p in paths]


@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
def test_shards_hold_the_libraries_encode_after_each_documents_start(tmp_path, docs, family):
    tokenizer_json = train_bpe(tmp_path / 'tokenizer.json', family)
    assert (
        main(
            [
                'shard',
                *docs,
                '--family',
                family,
                '--output',
                str(tmp_path / 'hf'),
                '--tokenizer',
                str(tokenizer_json),
            ]
        )
        == 0
    )
    hf = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    hf.encode_special_tokens = True  # llm.c's fineweb.py: encode(..., split_special_tokens=True)
    start = hf.token_to_id(SPECIALS[family][0])  # <|endoftext|> / <|begin_of_text|>
    expected = []
    for text in DOCS:
        expected += [start] + hf.encode(text, add_special_tokens=False).ids
    found = read_shard(tmp_path / 'hf_train_000000.bin', family)
    assert found == expected
    # The '<|endoftext|>' written inside a document is text, not the special id.
    special_ids = {hf.token_to_id(s) for s in SPECIALS[family]}
    assert sum(t in special_ids for t in found) == len(DOCS)
    assert hf.decode(found, skip_special_tokens=False) == ''.join(SPECIALS[family][0] + d for d in DOCS)

    ranks = tiktoken_file_from(tokenizer_json, tmp_path / 'tokenizer.model')
    assert (
        main(
            [
                'shard',
                *docs,
                '--family',
                family,
                '--output',
                str(tmp_path / 'tk'),
                '--tokenizer',
                str(tmp_path / 'tokenizer.model'),
            ]
        )
        == 0
    )
    pattern = GPT2_PATTERN if family == 'gpt2' else LLAMA3_PATTERN
    encoding = tiktoken.Encoding(
        't', pat_str=pattern, mergeable_ranks=ranks, special_tokens={SPECIALS[family][0]: len(ranks)}
    )
    expected = []
    for text in DOCS:
        expected += [len(ranks)] + encoding.encode_ordinary(text)
    found = read_shard(tmp_path / 'tk_train_000000.bin', family)
    assert found == expected
    assert encoding.decode(found) == ''.join(SPECIALS[family][0] + d for d in DOCS)


def test_tinyshakespeare_sections_and_jsonl_rows_are_documents(tmp_path):
    tokenizer_json = train_bpe(tmp_path / 'tokenizer.json', 'gpt2')
    hf = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    text = (
        'First Citizen:\nBefore we proceed.\n\nAll:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved.\n'
    )
    (tmp_path / 'play.txt').write_text(text)
    # llm.c dev/data/tinyshakespeare.py: EOT, then each "\n\n" section with its "\n\n" put back.
    sections = text.split('\n\n')
    expected = []
    for i, s in enumerate(sections):
        expected += [0] + hf.encode(s + '\n\n' if i != len(sections) - 1 else s).ids
    assert (
        main(
            [
                'shard',
                str(tmp_path / 'play.txt'),
                '--family',
                'gpt2',
                '--output',
                str(tmp_path / 'ts'),
                '--tokenizer',
                str(tokenizer_json),
                '--split_blank_lines',
                '--val_tokens',
                '5',
            ]
        )
        == 0
    )
    assert (
        read_shard(tmp_path / 'ts_val_000000.bin', 'gpt2')
        + read_shard(tmp_path / 'ts_train_000001.bin', 'gpt2')
        == expected
    )

    rows = [{'text': s, 'id': i} for i, s in enumerate(sections)]
    (tmp_path / 'rows.jsonl').write_text('\n'.join(json.dumps(r) for r in rows) + '\n')
    assert (
        main(
            [
                'shard',
                str(tmp_path / 'rows.jsonl'),
                '--family',
                'gpt2',
                '--output',
                str(tmp_path / 'js'),
                '--tokenizer',
                str(tokenizer_json),
            ]
        )
        == 0
    )
    expected = [t for s in sections for t in [0] + hf.encode(s).ids]
    assert read_shard(tmp_path / 'js_train_000000.bin', 'gpt2') == expected


def test_parquet_rows_are_documents_when_pyarrow_is_there(tmp_path):
    pa = pytest.importorskip('pyarrow')
    import pyarrow.parquet as pq

    pq.write_table(pa.table({'text': DOCS}), tmp_path / 'part.parquet')
    assert (
        main(
            ['shard', str(tmp_path / 'part.parquet'), '--family', 'llama3', '--output', str(tmp_path / 'pq')]
        )
        == 0
    )
    found = read_shard(tmp_path / 'pq_train_000000.bin', 'llama3')
    assert found.count(128000) == 2 and len(found) == 2 + sum(len(d.encode()) for d in DOCS)


@pytest.mark.parametrize('source', ['json', 'tiktoken'])
def test_llmc_tokenizer_file_decodes_what_the_bpe_encodes(tmp_path, source, capsys):
    tokenizer_json = train_bpe(tmp_path / 'tokenizer.json', 'llama3')
    ranks = tiktoken_file_from(tokenizer_json, tmp_path / 'tokenizer.model')
    given = tokenizer_json if source == 'json' else tmp_path / 'tokenizer.model'
    out = tmp_path / 'llama3_tokenizer.bin'
    assert main(['tokenizer', str(given), '--family', 'llama3', '--output', str(out)]) == 0
    assert 'tokens, EOT' in capsys.readouterr().out
    magic, version, eot, pieces = read_llmc_tokenizer(out)
    assert (magic, version) == (20240801, 2)
    text = corpus_text(20_000)
    if source == 'json':
        hf = tokenizers.Tokenizer.from_file(str(tokenizer_json))
        ids = hf.encode(text, add_special_tokens=False).ids
        assert pieces[eot] == b'<|end_of_text|>' and eot == hf.token_to_id('<|end_of_text|>')
        assert len(pieces) == hf.get_vocab_size()
    else:
        encoding = tiktoken.Encoding('t', pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens={})
        ids = encoding.encode_ordinary(text)
        # LLaMA-3's 256 specials follow the ranks: <|begin_of_text|> first, <|end_of_text|> next.
        assert len(pieces) == len(ranks) + 256 and eot == len(ranks) + 1
        assert pieces[len(ranks)] == b'<|begin_of_text|>' and pieces[eot] == b'<|end_of_text|>'
        assert all(pieces[rank] == piece for piece, rank in ranks.items())
    assert b''.join(pieces[i] for i in ids) == text.encode()


def test_gpt2_tokenizer_file_is_llm_cs(tmp_path):
    tokenizer_json = train_bpe(tmp_path / 'tokenizer.json', 'gpt2')
    assert (
        main(['tokenizer', str(tokenizer_json), '--family', 'gpt2', '--output', str(tmp_path / 't.bin')]) == 0
    )
    magic, version, eot, pieces = read_llmc_tokenizer(tmp_path / 't.bin')
    assert (magic, version, eot, pieces[0]) == (20240328, 2, 0, b'<|endoftext|>')
    assert main(['info', str(tmp_path / 't.bin')]) == 0


def test_the_tokenizer_command_replaces_only_with_force_and_never_its_input(tmp_path, capsys):
    tokenizer_json = train_bpe(tmp_path / 'tokenizer.json', 'gpt2')
    json_before = tokenizer_json.read_bytes()
    out = tmp_path / 't.bin'
    out.write_bytes(b'a file the user keeps')
    command = ['tokenizer', str(tokenizer_json), '--family', 'gpt2', '--output']
    assert main([*command, str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f'error: {out}: --output: expected a path that does not exist yet, found a file there; '
        'pass --force to replace it'
    )
    assert out.read_bytes() == b'a file the user keeps'
    assert main([*command, str(out), '--force']) == 0
    assert read_llmc_tokenizer(out)[0] == 20240328
    capsys.readouterr()
    assert main([*command, str(tokenizer_json), '--force']) == 2
    assert 'expected a file other than the input' in capsys.readouterr().err
    assert tokenizer_json.read_bytes() == json_before


@pytest.mark.parametrize(
    'content, family, message',
    [
        (
            b'aGVsbG8= 0\nnot-a-line\n',
            'gpt2',
            'bad.tok: line 2: expected \'BASE64 RANK\' (a tiktoken BPE file)',
        ),
        (
            b'aGVsbG8= 0\n',
            'gpt2',
            'expected a rank for each of the 256 single bytes (byte-level BPE), found 256 '
            'missing, first byte 0',
        ),
    ],
)
def test_a_bad_tiktoken_file_is_one_line(tmp_path, content, family, message, capsys):
    (tmp_path / 'bad.tok').write_bytes(content)
    (tmp_path / 'a.txt').write_text('hello')
    assert (
        main(
            [
                'shard',
                str(tmp_path / 'a.txt'),
                '--family',
                family,
                '--output',
                str(tmp_path / 'x'),
                '--tokenizer',
                str(tmp_path / 'bad.tok'),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count('\n') == 0 and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['a.txt', 'bad.tok']


def _byte_ranks(*extra: tuple[bytes, int]) -> bytes:
    """A tiktoken file written from tiktoken's format: one 'BASE64 RANK' line per token, the 256
    single bytes first, then `extra`."""
    lines = [(bytes([b]), b) for b in range(256)] + list(extra)
    return b''.join(base64.b64encode(piece) + b' %d\n' % rank for piece, rank in lines)


@pytest.mark.parametrize(
    'content, message',
    [
        (
            _byte_ranks((b'ab', 100)),
            "line 257: expected a rank no earlier line gives, found rank 100, which line 101",
        ),
        (
            _byte_ranks((b'ab', 256), (b'ab', 257)),
            "line 258: expected a token no earlier line lists, found b'ab'",
        ),
        (_byte_ranks((b'ab', -1)), 'line 257: expected a rank >= 0 (a token id), found rank -1'),
    ],
    ids=['a rank given twice', 'a token listed twice', 'a negative rank'],
)
@pytest.mark.parametrize('command', ['shard', 'generate'])
def test_a_tiktoken_file_with_a_rank_twice_is_one_line_not_a_panic(
    tmp_path, content, message, command, capsys
):
    """tiktoken's Rust core panics (pyo3_runtime.PanicException, a traceback) on a rank given twice."""
    (tmp_path / 'bad.tok').write_bytes(content)
    (tmp_path / 'a.txt').write_text('hello')
    if command == 'shard':
        args = ['shard', str(tmp_path / 'a.txt'), '--family', 'gpt2', '--output', str(tmp_path / 'x')]
        assert main([*args, '--tokenizer', str(tmp_path / 'bad.tok')]) == 2
        err = capsys.readouterr().err.strip()
    else:
        from jaxtrain.data.default_corpus import load_run_tokenizer

        with pytest.raises(LLMCFormatError) as refused:
            load_run_tokenizer('', str(tmp_path / 'bad.tok'), 'gpt2', 50257)
        err = str(refused.value)
    assert err.count('\n') == 0 and 'bad.tok: ' in err and message in err, err
    assert 'Panic' not in err


def test_a_tokenizer_without_the_familys_document_start_is_named(tmp_path, capsys):
    tokenizer_json = train_bpe(tmp_path / 'tokenizer.json', 'gpt2')
    (tmp_path / 'a.txt').write_text('hello')
    assert (
        main(
            [
                'shard',
                str(tmp_path / 'a.txt'),
                '--family',
                'llama3',
                '--output',
                str(tmp_path / 'x'),
                '--tokenizer',
                str(tokenizer_json),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {tokenizer_json}: document start token: expected '<|begin_of_text|>' among its "
        "tokens (the llama3 convention), found no such token; add it as a special token, or pass "
        "the other --family"
    )
    assert (
        main(
            [
                'shard',
                str(tmp_path / 'a.txt'),
                '--family',
                'gpt2',
                '--output',
                str(tmp_path / 'x'),
                '--from',
                'ids',
                '--tokenizer',
                str(tokenizer_json),
            ]
        )
        == 2
    )
    assert (
        'expected --from text (ids and shards are tokens already), found --from ids'
        in capsys.readouterr().err
    )


@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
def test_a_tiktoken_file_as_hf_files_encodes_the_same(tmp_path, family):
    from llmc_io.text.tokenizer_files import write_hf_tokenizer_files
    from llmc_io.text.bpe import load_text_tokenizer

    ranks = tiktoken_file_from(train_bpe(tmp_path / 'tokenizer.json', family), tmp_path / 'tokenizer.model')
    (tmp_path / 'hf').mkdir()
    written = write_hf_tokenizer_files(
        load_text_tokenizer(tmp_path / 'tokenizer.model', family), tmp_path / 'hf', 64
    )
    assert [Path(p).name for p in written] == ['tokenizer.json', 'tokenizer_config.json']
    pattern = GPT2_PATTERN if family == 'gpt2' else LLAMA3_PATTERN
    encoding = tiktoken.Encoding('t', pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    converted = tokenizers.Tokenizer.from_file(str(tmp_path / 'hf' / 'tokenizer.json'))
    converted.encode_special_tokens = True
    text = corpus_text(40_000) + "  x  \n\n  y's 123456 naïve   "
    assert converted.encode(text).ids == encoding.encode_ordinary(text)
    first_special = {'gpt2': '<|endoftext|>', 'llama3': '<|begin_of_text|>'}[family]
    assert converted.token_to_id(first_special) == len(ranks)


def test_info_describes_bpe_tokenizer_files(tmp_path, capsys):
    tokenizer_json = train_bpe(tmp_path / 'tokenizer.json', 'llama3')
    tiktoken_file_from(tokenizer_json, tmp_path / 'tokenizer.model')
    assert main(['info', str(tokenizer_json)]) == 0
    out = capsys.readouterr().out
    assert 'Hugging Face tokenizer.json' in out and '600 (max id + 1)' in out
    assert 'special tokens  2: <|begin_of_text|> = 0, <|end_of_text|> = 1' in out
    assert main(['info', str(tmp_path / 'tokenizer.model')]) == 0
    out = capsys.readouterr().out
    assert 'tiktoken BPE file' in out and 'ranks            598 (ids 0..597)' in out
    assert (
        '<|endoftext|> = 598; 599 tokens' in out
        and '256 specials from 598 (<|begin_of_text|>); 854 tokens' in out
    )


def test_a_json_that_is_no_tokenizer_is_one_line_saying_what_to_pass(tmp_path):
    from llmc_io.errors import LLMCFormatError
    from llmc_io.text.bpe import load_text_tokenizer

    path = tmp_path / 'tokenizer.json'
    path.write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(LLMCFormatError) as error:
        load_text_tokenizer(path, 'gpt2').encode('hello')
    message = str(error.value)
    assert message.startswith(f'{path}: content: expected a Hugging Face tokenizer.json, found unreadable (')
    assert message.endswith(
        "; pass the tokenizer.json of the model's Hugging Face folder (tokenizers' save() writes one)"
    )
    assert '\n' not in message
