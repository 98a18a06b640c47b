"""lr_scheduler.ckpt (InfiniTrain PR 151's SLRS file): the real files read and re-written byte for byte,
a file packed here from upstream's spec (a7949ac0 checkpoint.cc) read back, and every kind of damage
refused on one line naming the file."""

import struct

import numpy as np
import pytest
from infinitrain_samples import SAMPLES, needs_samples

from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.lr_scheduler import (
    entry_order,
    parse_lr_scheduler,
    read_lr_scheduler,
    render_lr_scheduler,
)


def _entry(name: str, kind: int, payload: bytes) -> bytes:
    raw = name.encode()
    return struct.pack('<I', len(raw)) + raw + bytes([kind]) + payload


def _file(*entries: bytes, count=None, magic=0x53524C53, version=1) -> bytes:
    return struct.pack('<III', magic, version, len(entries) if count is None else count) + b''.join(entries)


PLAIN = [
    _entry('base_lr', 2, struct.pack('<f', 0.1)),
    _entry('recover_lr', 2, struct.pack('<f', 0.01)),
    _entry('last_step', 1, struct.pack('<q', 20)),
]


@needs_samples
def test_every_real_file_reads_and_rewrites_byte_for_byte():
    files = sorted(SAMPLES.glob('lrs-*/*/checkpoint_*/lr_scheduler.ckpt'))
    assert len(files) == 7
    for path in files:
        state = read_lr_scheduler(path)
        assert len(state) in (3, 9) and isinstance(state['last_step'], int)
        assert all(isinstance(state[k], np.float32) for k in state if not k.endswith('last_step'))
        assert render_lr_scheduler(state) == path.read_bytes(), path


@needs_samples
def test_the_sequential_entry_order_is_libcxxs():
    state = read_lr_scheduler(SAMPLES / 'lrs-gpt2/a/checkpoint_step_000010/lr_scheduler.ckpt')
    # The order upstream's binary wrote (xxd of the file), which entry_order derives from insertion order.
    assert list(state) == [
        'scheduler_1.last_step', 'scheduler_1.recover_lr', 'scheduler_1.base_lr', 'scheduler_0.last_step',
        'recover_lr', 'scheduler_0.recover_lr', 'scheduler_0.base_lr', 'base_lr', 'last_step',
    ]  # fmt: skip
    assert (state['last_step'], state['scheduler_0.last_step'], state['scheduler_1.last_step']) == (10, 4, 5)
    assert entry_order({'last_step': 0, 'recover_lr': 0, 'base_lr': 0}) == [
        'base_lr',
        'recover_lr',
        'last_step',
    ]


def test_a_file_packed_from_the_spec_reads_back_with_every_type(tmp_path):
    data = _file(
        *PLAIN,
        _entry('d', 3, struct.pack('<d', 0.1)),
        _entry('s', 4, struct.pack('<I', 3) + b'abc'),
        _entry('v', 5, struct.pack('<Q', 2) + struct.pack('<2f', 1.5, -2.0)),
    )
    state = parse_lr_scheduler('x', data)
    assert state['last_step'] == 20 and state['recover_lr'] == np.float32(0.01)
    assert type(state['d']) is float and state['d'] == 0.1 and state['s'] == 'abc'
    assert state['v'].dtype == np.float32 and state['v'].tolist() == [1.5, -2.0]
    (tmp_path / 'lr_scheduler.ckpt').write_bytes(render_lr_scheduler(state))
    assert read_lr_scheduler(tmp_path / 'lr_scheduler.ckpt').keys() == state.keys()
    assert render_lr_scheduler({k: state[k] for k in ('last_step', 'recover_lr', 'base_lr')}) == _file(*PLAIN)


@pytest.mark.parametrize(
    'data, field, hint',
    [
        (_file(*PLAIN, magic=0x54504B43), 'magic: expected 0x53524C53 ("SLRS"), found 0x54504B43', 'not an'),
        (_file(*PLAIN, version=2), 'version: expected 1, found 2', 'does not know'),
        (_file(_entry('last_step', 9, struct.pack('<q', 1))), "entry 'last_step': type byte", 'damaged'),
        (_file(*PLAIN)[:-3], "entry 'last_step': value: expected 8 bytes", 'truncated'),
        (_file(*PLAIN)[:34], "entry 1: name: expected 10 bytes", 'truncated'),
        (_file(*PLAIN, count=1000), 'entry count: expected at most 9 entries in the 69 bytes', 'damaged'),
        (_file(*PLAIN, count=4), "entry 3: name length: expected 4 bytes", 'truncated'),
        (_file(*PLAIN) + b'\0', 'end of file: expected the end after 3 entries', 'damaged'),
        (_file(PLAIN[0], PLAIN[0]), "entry 'base_lr': expected each name once", ''),
        (b'SLR', 'magic: expected 4 bytes', 'truncated'),
    ],
)
def test_damage_is_one_line_naming_the_file(tmp_path, data, field, hint):
    path = tmp_path / 'lr_scheduler.ckpt'
    path.write_bytes(data)
    with pytest.raises(LLMCFormatError) as error:
        read_lr_scheduler(path)
    message = str(error.value)
    assert message.startswith(f'{path}: {field}') and hint in message and '\n' not in message
