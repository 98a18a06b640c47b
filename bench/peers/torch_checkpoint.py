"""PyTorch's checkpoints of a training state, the ckpt_io figure's peers (bench/ckpt_io.py).

    python3 bench/peers/torch_checkpoint.py SHAPES_JSON WORK_DIR [--device cuda]

SHAPES_JSON holds {parameter name: [dims]}. The state is every parameter in fp32 three times (the
weights and AdamW's two moments), as jaxtrain saves a run with --save_optimizer_state, living on
the device. Each peer saves it and then loads it back onto the device:
  torch.save   one file, flushed to the disk (fsync) before the clock stops; torch.load with
               map_location=device;
  torch DCP    torch.distributed.checkpoint.save in one process, every file it wrote fsynced;
               load into tensors already allocated on the device.
Between a save and its load the files are dropped from the page cache (posix_fadvise
DONTNEED after the fsync), so that each load reads the disk, as a restore after a restart does.
Prints one JSON line per peer: seconds to save and to load, the bytes, and the peak RSS so far.
"""

import argparse
import json
import os
import resource
import shutil
import time
from pathlib import Path

import torch


def training_state(shapes: dict, device: str) -> dict:
    generator = torch.Generator(device=device).manual_seed(0)
    return {
        f'{part}/{name}': torch.randn(dims, generator=generator, device=device, dtype=torch.float32)
        for part in ('params', 'mu', 'nu')
        for name, dims in shapes.items()
    }


def _files(path: Path):
    return [path] if path.is_file() else [p for p in sorted(path.rglob('*')) if p.is_file()]


def fsync_all(path: Path) -> None:
    for file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(path if path.is_dir() else path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_from_page_cache(path: Path) -> None:
    for file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in _files(path))


def _sync(device: str) -> None:
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def torch_save_and_load(state: dict, work: Path, device: str) -> dict:
    path = work / 'state.pt'
    _sync(device)
    began = time.perf_counter()
    with open(path, 'wb') as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    save_s = time.perf_counter() - began
    size = _size(path)
    drop_from_page_cache(path)
    began = time.perf_counter()
    loaded = torch.load(path, map_location=device)
    _sync(device)
    load_s = time.perf_counter() - began
    assert all(torch.equal(loaded[k], state[k]) for k in list(state)[:3])
    del loaded
    path.unlink()
    return {'peer': 'torch.save', 'save_s': save_s, 'load_s': load_s, 'bytes': size}


def dcp_save_and_load(state: dict, work: Path, device: str) -> dict:
    import torch.distributed.checkpoint as dcp

    path = work / 'dcp'
    _sync(device)
    began = time.perf_counter()
    dcp.save(state, checkpoint_id=str(path))
    fsync_all(path)
    save_s = time.perf_counter() - began
    size = _size(path)
    drop_from_page_cache(path)
    target = {k: torch.empty_like(v) for k, v in state.items()}
    _sync(device)
    began = time.perf_counter()
    dcp.load(target, checkpoint_id=str(path))
    _sync(device)
    load_s = time.perf_counter() - began
    assert all(torch.equal(target[k], state[k]) for k in list(state)[:3])
    del target
    shutil.rmtree(path)
    return {'peer': 'torch DCP', 'save_s': save_s, 'load_s': load_s, 'bytes': size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('shapes', help='a JSON file of {parameter name: [dims]}')
    parser.add_argument('work', help='a folder on the disk to measure; emptied of what this writes')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu', help='cuda or cpu')
    args = parser.parse_args()
    shapes = json.loads(Path(args.shapes).read_text())
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    state = training_state(shapes, args.device)
    for peer in (torch_save_and_load, dcp_save_and_load):
        result = peer(state, work, args.device)
        print(json.dumps({**result, 'device': args.device, 'peak_rss_bytes': _peak_rss()}), flush=True)


if __name__ == '__main__':
    main()
