"""Helpers for tests that run the real trainer in-process on tiny models."""

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def write_shard(path, tokens, kind='gpt2'):
    """An llm.c token shard written straight from FORMATS.md §3 (not through llmc_io)."""
    magic, version, dtype = {'gpt2': (20240520, 1, np.uint16), 'llama3': (20240801, 7, np.uint32)}[kind]
    header = np.zeros(256, np.int32)
    header[:3] = magic, version, len(tokens)
    with open(path, 'wb') as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype).tobytes())
    return str(path)


def random_shard(path, num_tokens=40_000, vocab=512, kind='gpt2', seed=0):
    return write_shard(path, np.random.default_rng(seed).integers(0, vocab, num_tokens), kind)


def load_config(family='gpt2', variant='tiny', **overrides):
    spec = importlib.util.spec_from_file_location(f'config_{family}', REPO / 'configs' / f'{family}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(variant)
    config.num_devices = 1
    config.update(overrides)
    return config


def train(config) -> tuple[int, dict[int, float], str]:
    """Runs the trainer; returns (exit code, {step: loss} from metrics.jsonl, stdout)."""
    from jaxtrain import train as train_lib

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = train_lib.run(config)
    losses = {}
    metrics = Path(config.metrics_dir) / 'metrics.jsonl' if config.metrics_dir else None
    if metrics and metrics.exists():
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            if 'loss' in row:
                losses[row['step']] = row['loss']
    return code, losses, out.getvalue()


def restore_params(step_dir):
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer().restore(Path(step_dir) / 'params')
