"""`python -m llmc_io shard`: text, ids or shards -> token shards of either family.

Shards are read back with plain NumPy from docs/formats.md §3 (256 int32 header: magic, version,
count; then uint16 tokens for GPT-2 (20240520, 1), uint32 for LLaMA-3 (20240801, 7)); byte
ids are checked against GPT-2's encoder.json facts ('!' 0, 'A' 32, newline 198, space 220).
"""

import numpy as np
import pytest

from llmc_io.__main__ import main

KINDS = {'gpt2': (20240520, 1, '<u2', 50256), 'llama3': (20240801, 7, '<u4', 128000)}


def read_shard(path, family):
    magic, version, dtype, _ = KINDS[family]
    raw = open(path, 'rb').read()
    header = np.frombuffer(raw[:1024], '<i4')
    tokens = np.frombuffer(raw[1024:], dtype)
    assert header[:3].tolist() == [magic, version, len(tokens)]
    return tokens


@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
def test_text_becomes_byte_ids_after_each_documents_start(tmp_path, family, capsys):
    (tmp_path / 'one.txt').write_bytes(b'A!\n')
    (tmp_path / 'two.txt').write_bytes(b' A')
    out = tmp_path / 'out' / 'mine'
    assert (
        main(
            [
                'shard',
                str(tmp_path / 'one.txt'),
                str(tmp_path / 'two.txt'),
                '--family',
                family,
                '--output',
                str(out),
                '--shard_tokens',
                '4',
                '--val_tokens',
                '2',
            ]
        )
        == 0
    )
    start = KINDS[family][3]
    names = ['mine_val_000000.bin', 'mine_train_000001.bin', 'mine_train_000002.bin']
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == sorted(names)
    tokens = np.concatenate([read_shard(tmp_path / 'out' / n, family) for n in names])
    assert tokens.tolist() == [start, 32, 0, 198, start, 220, 32]
    assert [len(read_shard(tmp_path / 'out' / n, family)) for n in names] == [2, 4, 1]
    assert capsys.readouterr().out.count('wrote ') == 3


def test_u16_to_u32_and_back_keeps_the_ids(tmp_path):
    ids = np.array([0, 7, 50256, 65535, 3], np.int64)
    np.save(tmp_path / 'ids.npy', ids)
    assert (
        main(
            [
                'shard',
                str(tmp_path / 'ids.npy'),
                '--from',
                'ids',
                '--family',
                'gpt2',
                '--output',
                str(tmp_path / 'g'),
            ]
        )
        == 0
    )
    assert read_shard(tmp_path / 'g_train_000000.bin', 'gpt2').tolist() == ids.tolist()
    assert (
        main(
            [
                'shard',
                str(tmp_path / 'g_train_*.bin'),
                '--from',
                'shard',
                '--family',
                'llama3',
                '--output',
                str(tmp_path / 'l'),
            ]
        )
        == 0
    )
    assert read_shard(tmp_path / 'l_train_000000.bin', 'llama3').tolist() == ids.tolist()
    assert (
        main(
            [
                'shard',
                str(tmp_path / 'l_train_000000.bin'),
                '--from',
                'shard',
                '--family',
                'gpt2',
                '--output',
                str(tmp_path / 'back'),
            ]
        )
        == 0
    )
    assert read_shard(tmp_path / 'back_train_000000.bin', 'gpt2').tolist() == ids.tolist()


def test_an_id_too_large_for_uint16_is_refused_and_nothing_written(tmp_path, capsys):
    np.save(tmp_path / 'ids.npy', np.array([5, 128000, 6]))
    assert (
        main(
            [
                'shard',
                str(tmp_path / 'ids.npy'),
                '--from',
                'ids',
                '--family',
                'gpt2',
                '--output',
                str(tmp_path / 'g'),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count('\n') == 0
    assert 'ids.npy: token 1: expected an id in [0, 65535] for a gpt2 shard, found 128000' in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ids.npy']


def test_a_directory_as_input_is_named(tmp_path, capsys):
    assert main(['shard', str(tmp_path), '--family', 'gpt2', '--output', str(tmp_path / 'x')]) == 2
    assert f'{tmp_path}: INPUT: expected a file, found a directory' in capsys.readouterr().err


def _shard_ids(tmp_path, ids, output, *flags) -> int:
    np.save(tmp_path / 'ids.npy', np.asarray(ids))
    argv = ['shard', str(tmp_path / 'ids.npy'), '--from', 'ids', '--family', 'gpt2', '--output', str(output)]
    return main([*argv, '--shard_tokens', '2', *flags])


def test_a_second_corpus_never_mixes_with_the_first(tmp_path, capsys):
    out = tmp_path / 'out'
    assert _shard_ids(tmp_path, [1, 2, 3, 4, 5, 6, 7], out, '--val_tokens', '1') == 0
    first = {p.name: p.read_bytes() for p in tmp_path.glob('out_*.bin')}
    assert sorted(first) == [
        'out_train_000001.bin',
        'out_train_000002.bin',
        'out_train_000003.bin',
        'out_val_000000.bin',
    ]
    capsys.readouterr()
    assert _shard_ids(tmp_path, [8, 9, 10], out) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f'error: {out}: --output: expected a prefix with no shards yet, found 4 (out_train_000001.bin, '
        'out_train_000002.bin, out_train_000003.bin, ...); choose another --output, or pass --force to '
        'remove them all and write the new corpus'
    )
    assert {p.name: p.read_bytes() for p in tmp_path.glob('out_*.bin')} == first
    assert _shard_ids(tmp_path, [8, 9, 10], out, '--force') == 0
    assert sorted(p.name for p in tmp_path.glob('out_*.bin')) == [
        'out_train_000000.bin',
        'out_train_000001.bin',
    ]
    tokens = [read_shard(p, 'gpt2').tolist() for p in sorted(tmp_path.glob('out_train_*.bin'))]
    assert tokens == [[8, 9], [10]]


def test_an_input_that_is_one_of_the_old_shards_is_refused_even_with_force(tmp_path, capsys):
    out = tmp_path / 'out'
    assert _shard_ids(tmp_path, [1, 2, 3], out) == 0
    before = (tmp_path / 'out_train_000000.bin').read_bytes()
    capsys.readouterr()
    argv = ['shard', str(tmp_path / 'out_train_000000.bin'), '--from', 'shard', '--family', 'llama3']
    assert main([*argv, '--output', str(out), '--force']) == 2
    err = capsys.readouterr().err
    assert 'out_train_000000.bin: --output: expected a file other than the input' in err
    assert (tmp_path / 'out_train_000000.bin').read_bytes() == before
    assert sorted(p.name for p in tmp_path.glob('out_*.bin')) == [
        'out_train_000000.bin',
        'out_train_000001.bin',
    ]
