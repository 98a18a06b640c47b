"""The CKPT state-dict binary: a writer written here from upstream's C++, round trips, every malformed case.

`_cpp_save_state_dict` follows InfiniTensor/InfiniTrain b24d92f infini_train/src/checkpoint/checkpoint.cc
SaveStateDict line by line (u32 magic, u32 version, u32 count; per entry WriteString(name), int8 dtype,
u32 ndim, int64 dims, u64 bytes, raw data), independently of llmc_io.
"""

import struct

import numpy as np
import pytest

from llmc_io import LLMCFormatError
from llmc_io.infinitrain.statedict import CkptTensor, read_state_dict, state_dict_bytes, write_state_dict
from piece_digests import piece_digest


def _cpp_save_state_dict(entries):
    """entries: [(name, dtype enum int8, dims, raw bytes)] in map order."""
    out = bytearray()
    out += struct.pack('<I', 0x54504B43) + struct.pack('<I', 1) + struct.pack('<I', len(entries))
    for name, dtype, dims, raw in entries:
        encoded = name.encode()
        out += struct.pack('<I', len(encoded)) + encoded
        out += struct.pack('<b', dtype)
        out += struct.pack('<I', len(dims))
        for d in dims:
            out += struct.pack('<q', d)
        out += struct.pack('<Q', len(raw))
        out += raw
    return bytes(out)


def _sample_entries():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4)).astype('<f4')
    bf16 = np.array([0x3F80, 0xC000, 0x7FC0], dtype='<u2')  # 1.0, -2.0, NaN as bf16 bits
    mask = np.tril(np.ones((2, 2), '<f4')).reshape(1, 1, 2, 2)
    return (
        [
            ('lm_head.weight', 11, (3, 4), w.tobytes()),
            ('adam.t', 8, (), struct.pack('<q', 10)),
            ('transformer.h.0.attn.bias', 11, (1, 1, 2, 2), mask.tobytes()),
            ('x.bf16', 9, (3,), bf16.tobytes()),
            ('x.u8', 1, (2,), b'\x07\xff'),
            ('empty', 11, (0, 5), b''),
        ],
        w,
        bf16,
    )


def test_reader_and_writer_match_upstreams_layout(tmp_path):
    entries, w, bf16 = _sample_entries()
    blob = _cpp_save_state_dict(entries)
    path = tmp_path / 'model.ckpt'
    path.write_bytes(blob)
    got = read_state_dict(path)
    assert list(got) == [e[0] for e in entries]  # file order kept
    assert got['lm_head.weight'].dtype == 11 and np.array_equal(got['lm_head.weight'].array, w)
    assert (
        got['adam.t'].shape == () and int(got['adam.t'].array) == 10 and got['adam.t'].dtype_name == 'kINT64'
    )
    assert got['x.bf16'].dtype == 9 and np.array_equal(got['x.bf16'].array, bf16)
    assert got['empty'].shape == (0, 5)
    assert got['lm_head.weight'].offset == 12 + 4 + len('lm_head.weight') + 1 + 4 + 16 + 8
    # Writing what was read gives back the same bytes; so does writing from plain arrays.
    assert state_dict_bytes(got) == blob
    plain = {'a': w, 't': np.array(10, np.int64)}
    assert state_dict_bytes(plain) == _cpp_save_state_dict(
        [('a', 11, (3, 4), w.tobytes()), ('t', 8, (), struct.pack('<q', 10))]
    )
    out = tmp_path / 'out' / 'optimizer.ckpt'
    out.parent.mkdir()
    write_state_dict(out, got)
    assert out.read_bytes() == blob
    assert [p.name for p in out.parent.iterdir()] == ['optimizer.ckpt']  # no temporary left behind


def _malformed_cases():
    good = _cpp_save_state_dict([('w', 11, (2, 2), np.ones(4, '<f4').tobytes())])
    name_end = 12 + 4 + 1
    return {
        'magic': (b'PTKC' + good[4:], 'magic'),
        'version': (good[:4] + struct.pack('<I', 2) + good[8:], 'version'),
        'truncated header': (good[:6], 'version'),
        'truncated tensor': (good[:-3], "tensor 'w' data"),
        'nbytes': (
            _cpp_save_state_dict([('w', 11, (2, 2), np.ones(3, '<f4').tobytes())]),
            "tensor 'w' nbytes",
        ),
        'unknown dtype': (good[:name_end] + struct.pack('<b', 42) + good[name_end + 1 :], "tensor 'w' dtype"),
        'truncated name': (good[:12] + struct.pack('<I', 99) + b'w', 'tensor #0 name'),
        'count too high': (good[:8] + struct.pack('<I', 2) + good[12:], 'tensor #1 name length'),
        'trailing bytes': (good + b'\0', 'end of file'),
        'duplicate name': (_cpp_save_state_dict([('w', 8, (), bytes(8))] * 2), "tensor 'w'"),
    }


@pytest.mark.parametrize('case', sorted(_malformed_cases()))
def test_each_malformed_file_is_one_line_naming_file_and_field(tmp_path, case):
    blob, field = _malformed_cases()[case]
    path = tmp_path / 'model.ckpt'
    path.write_bytes(blob)
    with pytest.raises(LLMCFormatError) as err:
        read_state_dict(path)
    message = str(err.value)
    assert '\n' not in message
    assert message.startswith(f'{path}: ') and err.value.field == field, message
    assert 'expected' in message and 'found' in message


def test_missing_file(tmp_path):
    with pytest.raises(LLMCFormatError, match='nothing there'):
        read_state_dict(tmp_path / 'model.ckpt')


def test_in_memory_entries_keep_their_dtype_code():
    t = CkptTensor(9, np.array([0x3F80], '<u2'))
    assert state_dict_bytes({'b': t}) == _cpp_save_state_dict([('b', 9, (1,), b'\x80\x3f')])


def test_a_streamed_file_is_upstreams_bytes_in_slices_with_its_digest(tmp_path, monkeypatch):
    # Slices of 16 bytes: the (5, 3) weight goes out in one-row pieces, transposed from a (3, 5) view.
    from llmc_io.infinitrain import statedict

    monkeypatch.setattr(statedict, 'SLICE_BYTES', 16)
    base = np.arange(15, dtype=np.float64).reshape(3, 5)  # float64: converted to fp32 slice by slice
    entries = {'w': CkptTensor(11, base.T), 'adam.t': CkptTensor(8, np.array(7, np.int64))}
    expected = _cpp_save_state_dict(
        [('w', 11, (5, 3), base.T.astype('<f4').tobytes()), ('adam.t', 8, (), struct.pack('<q', 7))]
    )
    path = tmp_path / 'optimizer.ckpt'
    digest = write_state_dict(path, entries)
    assert path.read_bytes() == expected
    assert digest == piece_digest(expected)


def test_a_file_flushed_and_hashed_behind_its_write_is_the_same_bytes(tmp_path, monkeypatch):
    # A flush to the disk every 16 bytes and the hash one piece behind the write: every stage of
    # the pipeline runs many times, and the file is still upstream's bytes, its digest theirs.
    from llmc_io import atomic_file, piece_digest as piece_digest_module
    from llmc_io.infinitrain import statedict

    monkeypatch.setattr(statedict, 'SLICE_BYTES', 16)
    monkeypatch.setattr(atomic_file, 'FLUSH_BYTES', 16)
    monkeypatch.setattr(atomic_file, 'HASH_BEHIND', 1)
    monkeypatch.setattr(piece_digest_module, 'PIECE_BYTES', 48)  # many pieces, across the slices
    calls = []
    real_fdatasync = atomic_file.os.fdatasync
    monkeypatch.setattr(atomic_file.os, 'fdatasync', lambda fd: (calls.append(fd), real_fdatasync(fd)))
    rng = np.random.default_rng(3)
    weights = rng.standard_normal((40, 7)).astype('<f4')
    expected = _cpp_save_state_dict([('w', 11, (7, 40), weights.T.tobytes())])
    path = tmp_path / 'model.ckpt'
    digest = write_state_dict(path, {'w': CkptTensor(11, weights.T)})
    assert path.read_bytes() == expected and digest == piece_digest(expected, 48)
    assert len(calls) >= 7  # flushed behind the write (a flush a row of 160 bytes), not only at its end


def test_a_read_takes_the_files_digest_as_it_reads(tmp_path):
    entries, _, _ = _sample_entries()
    blob = _cpp_save_state_dict(entries)
    path = tmp_path / 'optimizer.ckpt'
    path.write_bytes(blob)
    digests = {}
    tensors = read_state_dict(path, digests)
    assert digests == {str(path): piece_digest(blob)}
    assert list(tensors) == [e[0] for e in entries]
    path.write_bytes(blob + b'x')  # a read that fails records no digest
    digests = {}
    with pytest.raises(LLMCFormatError, match='end of file'):
        read_state_dict(path, digests)
    assert digests == {}


def test_a_piece_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    from llmc_io.atomic_file import write_pieces_atomically

    path = tmp_path / 'model.ckpt'
    path.write_bytes(b'old')

    def broken():
        raise MemoryError('no room for the slice')

    with pytest.raises(MemoryError):
        write_pieces_atomically(path, [lambda: b'new'] * 20 + [broken] + [lambda: b'x'] * 20, makers=2)
    assert [p.name for p in tmp_path.iterdir()] == ['model.ckpt'] and path.read_bytes() == b'old'


@pytest.mark.parametrize('shape', [(600, 300), (5, 3), (257, 513)])
def test_a_transposed_view_copied_in_tiles_equals_numpys_copy(shape):
    from llmc_io.tensors import contiguous

    weights = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    for view in (weights.T, weights[::2].T, weights):
        for dtype in (np.float32, np.float64):
            copied = contiguous(view, dtype)
            assert copied.flags.c_contiguous and copied.dtype == dtype
            np.testing.assert_array_equal(copied, np.ascontiguousarray(view, dtype=dtype))
