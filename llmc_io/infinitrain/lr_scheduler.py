"""InfiniTrain's lr_scheduler.ckpt (the SLRS file of PR 151): a strict reader, and the bytes upstream writes.

Upstream: InfiniTensor/InfiniTrain a7949ac0f46fb3de64520a18bc13ebc70b6bc158,
infini_train/src/checkpoint/checkpoint.cc (SaveLRSchedulerState, LoadLRSchedulerState,
WriteLRSchedulerStateValue). Little-endian, packed, nothing after the last entry:

    u32 magic 0x53524C53 ("SLRS") | u32 version 1 | u32 count
    count x { u32 name_len | name | u8 type | value }
    type 1 int64 | 2 float32 | 3 float64 | 4 string (u32 len, bytes) | 5 vector<float> (u64 n, n x float32)

The state is a std::unordered_map<std::string, StateValue>, written in its iteration order, which for
libc++ (the build of ../shared/infinitrain) depends on the order the keys went in: LRScheduler::State()
inserts last_step, recover_lr, base_lr; SequentialLR::State() inserts its own three, then each child's
entries as `scheduler_<i>.<key>`, walking the child's own map (lr_scheduler.cc). `entry_order` rebuilds
that, so a written file equals upstream's byte for byte.

Values in Python: int = int64, numpy.float32 = float, float = double, str = string,
float32 ndarray = vector<float>.
"""

from __future__ import annotations

import os
import re
import struct

import numpy as np

from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.libcxx_order import LibcxxStringMap

FILE_NAME = 'lr_scheduler.ckpt'
MAGIC = 0x53524C53
VERSION = 1
INT64, FLOAT32, FLOAT64, STRING, FLOAT32_VECTOR = 1, 2, 3, 4, 5
_TYPE_NAMES = {
    INT64: 'int64',
    FLOAT32: 'float32',
    FLOAT64: 'double',
    STRING: 'string',
    FLOAT32_VECTOR: 'vector<float>',
}
_STATE_KEYS = ('last_step', 'recover_lr', 'base_lr')  # LRScheduler::State()'s insertion order
_CHILD = re.compile(r'^scheduler_(\d+)\.(.+)$')
_WRITTEN_BY = 'written by InfiniTrain PR 151 (a7949ac0) or later, or by jaxtrain'


class _Cursor:
    def __init__(self, path: str, data: bytes):
        self.path, self.data, self.at = path, data, 0

    def take(self, size: int, what: str) -> bytes:
        if self.at + size > len(self.data):
            raise LLMCFormatError(
                self.path,
                what,
                f'{size} bytes at offset {self.at}',
                f'{len(self.data) - self.at} before the end of the file',
                'the file is truncated; use the step directory\'s lr_scheduler.ckpt as InfiniTrain wrote it',
            )
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def unpack(self, fmt: str, what: str):
        return struct.unpack('<' + fmt, self.take(struct.calcsize('<' + fmt), what))[0]


def parse_lr_scheduler(path: str | os.PathLike, data: bytes) -> dict:
    """{name: value} in the file's order; one-line LLMCFormatError for anything upstream would not
    have written."""
    path = os.fspath(path)
    cursor = _Cursor(path, data)
    magic = cursor.unpack('I', 'magic')
    if magic != MAGIC:
        raise LLMCFormatError(
            path,
            'magic',
            f'0x{MAGIC:08X} ("SLRS")',
            f'0x{magic:08X}',
            f'not an InfiniTrain LR scheduler file ({_WRITTEN_BY})',
        )
    version = cursor.unpack('I', 'version')
    if version != VERSION:
        raise LLMCFormatError(
            path, 'version', VERSION, version, 'written by an InfiniTrain this reader does not know'
        )
    count = cursor.unpack('I', 'entry count')
    # An entry takes at least 4 (name length) + 1 (type) + 1 (value) bytes.
    if count * 6 > len(data) - cursor.at:
        raise LLMCFormatError(
            path,
            'entry count',
            f'at most {(len(data) - cursor.at) // 6} entries in the {len(data)} bytes of the file',
            count,
            'the count or the file is damaged; use the lr_scheduler.ckpt InfiniTrain wrote',
        )
    state = {}
    for index in range(count):
        length = cursor.unpack('I', f'entry {index}: name length')
        raw = cursor.take(length, f'entry {index}: name')
        try:
            name = raw.decode('utf-8')
        except UnicodeDecodeError:
            raise LLMCFormatError(path, f'entry {index}: name', 'UTF-8 text', repr(raw[:32])) from None
        kind = cursor.unpack('B', f"entry '{name}': type byte")
        where = f"entry '{name}': value"
        if kind == INT64:
            value = cursor.unpack('q', where)
        elif kind == FLOAT32:
            value = np.float32(cursor.unpack('f', where))
        elif kind == FLOAT64:
            value = cursor.unpack('d', where)
        elif kind == STRING:
            size = cursor.unpack('I', where + ' length')
            value = cursor.take(size, where).decode('utf-8', errors='replace')
        elif kind == FLOAT32_VECTOR:
            size = cursor.unpack('Q', where + ' length')
            value = np.frombuffer(cursor.take(4 * size, where), '<f4').astype(np.float32)
        else:
            raise LLMCFormatError(
                path,
                f"entry '{name}': type byte",
                '1 int64, 2 float, 3 double, 4 string or 5 vector<float>',
                kind,
                'the file is damaged or from an unknown InfiniTrain version',
            )
        if name in state:
            raise LLMCFormatError(path, f"entry '{name}'", 'each name once', 'a second entry of that name')
        state[name] = value
    if cursor.at != len(data):
        raise LLMCFormatError(
            path,
            'end of file',
            f'the end after {count} entries (offset {cursor.at})',
            f'{len(data) - cursor.at} more bytes',
            'the file is damaged; use the lr_scheduler.ckpt InfiniTrain wrote',
        )
    return state


def read_lr_scheduler(path: str | os.PathLike) -> dict:
    path = os.fspath(path)
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except OSError as e:
        raise LLMCFormatError(path, 'file', 'a readable lr_scheduler.ckpt', e.strerror or str(e)) from None
    return parse_lr_scheduler(path, data)


def entry_order(state: dict) -> list[str]:
    """The libc++ iteration order of the map upstream's State() builds with `state`'s keys: at each level
    last_step, recover_lr, base_lr go in first (then any other own key, in `state`'s order), then
    scheduler_0.*, scheduler_1.*, ... in their own level's iteration order."""
    own = [key for key in _STATE_KEYS if key in state]
    own += [key for key in state if key not in own and not _CHILD.match(key)]
    children: dict[int, dict] = {}
    for key, value in state.items():
        match = _CHILD.match(key)
        if match:
            children.setdefault(int(match.group(1)), {})[match.group(2)] = value
    table = LibcxxStringMap(own)
    for index in sorted(children):
        for key in entry_order(children[index]):
            table.insert(f'scheduler_{index}.{key}')
    return table.keys()


def _encode_value(name: str, value) -> bytes:
    if isinstance(value, bool):
        raise TypeError(f'{name}: a bool is not an LR scheduler state value')
    if isinstance(value, (int, np.integer)):
        return struct.pack('<Bq', INT64, int(value))
    if isinstance(value, np.float32):
        return struct.pack('<B', FLOAT32) + value.tobytes()
    if isinstance(value, (float, np.float64)):
        return struct.pack('<Bd', FLOAT64, float(value))
    if isinstance(value, str):
        raw = value.encode('utf-8')
        return struct.pack('<BI', STRING, len(raw)) + raw
    if isinstance(value, np.ndarray) and value.dtype == np.float32 and value.ndim == 1:
        return struct.pack('<BQ', FLOAT32_VECTOR, value.size) + value.astype('<f4').tobytes()
    raise TypeError(f'{name}: {type(value).__name__} is not an LR scheduler state value')


def render_lr_scheduler(state: dict) -> bytes:
    """The bytes SaveLRSchedulerState writes for `state` (insertion-ordered, see entry_order)."""
    parts = [struct.pack('<III', MAGIC, VERSION, len(state))]
    for name in entry_order(state):
        raw = name.encode('utf-8')
        parts.append(struct.pack('<I', len(raw)) + raw + _encode_value(name, state[name]))
    return b''.join(parts)


def describe(value) -> str:
    """A value as `ckpt show` prints it: the float32 in full, then its type."""
    if isinstance(value, np.float32):
        return f'{float(value)!r} (float)'
    if isinstance(value, float):
        return f'{value!r} (double)'
    if isinstance(value, np.ndarray):
        return f'{value.tolist()} (vector<float>)'
    return f'{value!r} ({_TYPE_NAMES[INT64] if isinstance(value, int) else "string"})'
