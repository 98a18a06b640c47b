"""The identity of a run's training data, recorded in each checkpoint and compared on resume.

A resumed run reads window `data_position` of its shards; if the shards changed, that is
another batch (other tokens at the same path and size; a shard cut short, so the run
lands in another epoch; a glob that gained a shard sorting first; the built-in corpus
rebuilt under another Python) and nothing else would notice. The identity is, per shard
in the stream's order: path, size, and a digest that stays cheap for large files:
sha256 over the size and BLOCKS blocks of BLOCK_BYTES at fixed, evenly spread offsets
(first and last included), so a change inside a block that is not sampled can go
unseen. The built-in corpus also records its builder (CORPUS_VERSION, Python version).
"""

import glob
import hashlib
import os
import platform
from pathlib import Path

BLOCKS = 16
BLOCK_BYTES = 1 << 16


def sampled_digest(path) -> str:
    size = os.path.getsize(path)
    digest = hashlib.sha256(str(size).encode())
    span = max(size - BLOCK_BYTES, 0)
    with open(path, 'rb') as f:
        for offset in sorted({span * i // (BLOCKS - 1) for i in range(BLOCKS)}):
            f.seek(offset)
            digest.update(f.read(BLOCK_BYTES))
    return f'sha256-{BLOCKS}x{BLOCK_BYTES}:{digest.hexdigest()}'


def data_identity(paths, built_in: bool) -> dict:
    """{'shards': [{path, size, digest}, ...], 'builder': ...} for the stream's paths in order."""
    shards = [
        {'path': str(Path(p).resolve()), 'size': os.path.getsize(p), 'digest': sampled_digest(p)}
        for p in paths
    ]
    builder = None
    if built_in:
        from jaxtrain.data.default_corpus import CORPUS_VERSION

        builder = {'corpus': 'stdlib', 'corpus_version': CORPUS_VERSION, 'python': platform.python_version()}
    return {'shards': shards, 'builder': builder}


def identity_differences(saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """(differences in content, shards that only moved), each a short clause."""
    different, moved = [], []
    if saved.get('builder') != now.get('builder'):
        different.append(f"built-in corpus: checkpoint {saved.get('builder')}, now {now.get('builder')}")
    before, after = saved.get('shards', []), now.get('shards', [])
    if len(before) != len(after):
        different.append(f'shards: checkpoint {len(before)}, now {len(after)}')
    for index, (a, b) in enumerate(zip(before, after)):
        if a.get('size') != b.get('size'):
            different.append(f"shard {index} {b['path']}: size checkpoint {a.get('size')}, now {b['size']}")
        elif a.get('digest') != b.get('digest'):
            different.append(f"shard {index} {b['path']}: other content at the same size")
        elif a.get('path') != b.get('path'):
            moved.append(f"shard {index}: checkpoint {a.get('path')}, now {b['path']} (same content)")
    return different, moved


def run_data_identity(config) -> dict:
    """The identity of the training data this config names (the stream's sorted glob)."""
    from jaxtrain.data.stream import data_paths

    return data_identity(sorted(glob.glob(data_paths(config)[0])), built_in=not config.input_bin)
