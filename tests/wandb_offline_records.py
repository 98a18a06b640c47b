"""The records of an offline W&B run's `.wandb` file, read with the file format written out here.

wandb >= 0.18 writes the file from its Go core and ships no Python reader for it. The format is
LevelDB's log (github.com/google/leveldb doc/log_format.md): 32 KiB blocks of chunks, each
crc32(type byte + data) as wandb computes it (zlib's CRC-32, little-endian), a little-endian
uint16 length and a type (FULL 1, FIRST 2, MIDDLE 3, LAST 4), after a 7-byte header ':W&B',
magic 0xBEE1, version 0. Each whole record is a wandb.proto Record (wandb's own schema).
"""

import struct
import zlib
from pathlib import Path

BLOCK = 32768
CHUNK_HEADER = 7
FILE_HEADER = b':W&B' + struct.pack('<HB', 0xBEE1, 0)


def wandb_records(run_root):
    """The Records of the one `.wandb` file under run_root, in order, each CRC checked."""
    from wandb.proto.wandb_internal_pb2 import Record

    (path,) = Path(run_root).glob('**/*.wandb')
    data = path.read_bytes()
    assert data[: len(FILE_HEADER)] == FILE_HEADER, f'{path}: header {data[:7]!r}'
    position, pending, records = len(FILE_HEADER), b'', []
    while position + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < CHUNK_HEADER:  # a block's trailer: too short for a chunk header
            position += left_in_block
            continue
        crc, length, kind = struct.unpack('<IHB', data[position : position + CHUNK_HEADER])
        chunk = data[position + CHUNK_HEADER : position + CHUNK_HEADER + length]
        position += CHUNK_HEADER + length
        if kind == 0:  # zero padding
            continue
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f'{path}: bad CRC at {position}'
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def of_type(records, name):
    return [getattr(r, name) for r in records if r.WhichOneof('record_type') == name]


def item_values(items) -> dict:
    """{key: value} of a history row's or config's items (a key is in `key` or, as wandb's core
    writes it for some rows, `nested_key`)."""
    import json

    return {item.key or '/'.join(item.nested_key): json.loads(item.value_json) for item in items}
