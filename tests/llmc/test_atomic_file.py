"""Files are written under a temporary name and renamed: a write that fails part-way (a full disk,
a kill) leaves the file that was there byte for byte, and no temporary behind. The disk filling up
is simulated by a file object that takes `room` bytes and then raises ENOSPC, as write(2) does."""

import errno
import io
import os

import numpy as np
import pytest

import llmc_io
from llmc_io.atomic_file import atomic_output
from llmc_io.hf import load_hf, save_hf
from llmc_io.infinitrain.lora_weights import read_lora_weights, write_lora_weights

HEADER = llmc_io.GPT2Header(
    max_seq_len=8, vocab_size=20, padded_vocab_size=32, num_layers=1, num_heads=2, channels=8
)


class _FullDisk(io.RawIOBase):
    """A writable file that holds `room` more bytes, then fails as a full disk does."""

    def __init__(self, real, room: int):
        self.real, self.room = real, room

    def writable(self):
        return True

    def write(self, data):
        data = bytes(data)
        taken = data[: self.room]
        self.real.write(taken)
        self.real.flush()
        self.room -= len(taken)
        if len(taken) < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)

    def fileno(self):
        return self.real.fileno()

    def close(self):
        self.real.close()
        super().close()


@pytest.fixture
def disk_full_after(monkeypatch):
    """Every file opened for writing (open or os.fdopen) fills the disk after `room` bytes."""

    def install(room: int):
        real_open, real_fdopen = open, os.fdopen

        def wrap(opener):
            def opened(*args, **kwargs):
                f = opener(*args, **kwargs)
                mode = args[1] if len(args) > 1 else kwargs.get('mode', 'r')
                return _FullDisk(f, room) if 'w' in mode and 'b' in mode else f

            return opened

        monkeypatch.setattr('builtins.open', wrap(real_open))
        monkeypatch.setattr(os, 'fdopen', wrap(real_fdopen))

    return install


def _adapters(seed):
    rng = np.random.default_rng(seed)
    name = 'transformer.h.0.attn.c_attn.lora_'
    return [(name + x, rng.normal(size=(4, 64)).astype(np.float32)) for x in 'AB']


def test_a_full_disk_leaves_the_previous_adapter_file(tmp_path, disk_full_after):
    path = tmp_path / 'lora.bin'
    write_lora_weights(path, _adapters(0))
    before = path.read_bytes()
    disk_full_after(1000)
    with pytest.raises(OSError, match='No space left'):
        write_lora_weights(path, _adapters(1))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ['lora.bin']
    assert [n for n, _ in read_lora_weights(path)] == [n for n, _ in _adapters(0)]


def _params(seed):
    rng, tree = np.random.default_rng(seed), {}
    for name, shape in HEADER.param_shapes().items():
        *parents, leaf = name.split('/')
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = rng.normal(0, 0.3, shape).astype(np.float32)
    return tree


def test_a_failed_hf_export_leaves_the_earlier_folder(tmp_path, disk_full_after):
    save_hf(tmp_path / 'hf', HEADER, _params(0))
    before = {p.name: p.read_bytes() for p in (tmp_path / 'hf').iterdir()}
    disk_full_after(4096)
    with pytest.raises(OSError):
        save_hf(tmp_path / 'hf', HEADER, _params(1))
    assert {p.name: p.read_bytes() for p in (tmp_path / 'hf').iterdir()} == before
    assert os.listdir(tmp_path) == ['hf']


def test_a_failed_new_hf_folder_leaves_nothing(tmp_path, disk_full_after):
    disk_full_after(4096)
    with pytest.raises(OSError):
        save_hf(tmp_path / 'hf', HEADER, _params(1))
    assert os.listdir(tmp_path) == []


def test_a_new_hf_folder_appears_complete(tmp_path):
    paths = save_hf(tmp_path / 'out' / 'hf', HEADER, _params(2))
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ['config.json', 'generation_config.json', 'model.safetensors']
    assert load_hf(tmp_path / 'out' / 'hf')[0] == HEADER
    assert oct(os.stat(tmp_path / 'out' / 'hf').st_mode & 0o777) == '0o755'


def test_an_exception_inside_the_block_keeps_the_old_file(tmp_path):
    path = tmp_path / 'f.txt'
    path.write_text('old')
    with pytest.raises(KeyError), atomic_output(path, 'w') as f:
        f.write('new, half')
        raise KeyError('interrupted')
    assert path.read_text() == 'old' and os.listdir(tmp_path) == ['f.txt']
    with atomic_output(path, 'w') as f:
        f.write('new')
    assert path.read_text() == 'new' and oct(os.stat(path).st_mode & 0o777) == '0o644'


@pytest.mark.parametrize('version', [3, 5])
def test_a_full_disk_says_disk_full_and_names_the_file(tmp_path, disk_full_for, version):
    """The kernel's own ENOSPC (/dev/full), under a model file's tensors: one line naming the file,
    not numpy's "N requested and M written"."""
    path = tmp_path / 'model.bin'
    llmc_io.save_gpt2(path, HEADER, _params(0), version=version)
    before = path.read_bytes()
    disk_full_for('model.bin')
    with pytest.raises(OSError) as error:
        llmc_io.save_gpt2(path, HEADER, _params(1), version=version)
    assert error.value.errno == errno.ENOSPC
    assert str(error.value) == (
        f'{path}: disk full (No space left on device) while writing it; the file is as it was before'
    )
    assert path.read_bytes() == before and os.listdir(tmp_path) == ['model.bin']


def test_numpys_short_write_is_called_disk_full_too(tmp_path, disk_full_for):
    """numpy's tofile drops the errno of a failed write ("N requested and M written")."""
    disk_full_for('big.bin')
    with pytest.raises(OSError, match=r'big\.bin: disk full \(short write: 0 of 100000 items written\)'):
        with atomic_output(tmp_path / 'big.bin') as f:
            np.zeros(100_000, np.float32).tofile(f)
    assert os.listdir(tmp_path) == []
