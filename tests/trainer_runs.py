"""Helpers for tests that run the real trainer in-process on tiny models."""

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def write_shard(path, tokens, kind='gpt2'):
    """An llm.c token shard written straight from docs/formats.md §3 (not through llmc_io)."""
    magic, version, dtype = {'gpt2': (20240520, 1, np.uint16), 'llama3': (20240801, 7, np.uint32)}[kind]
    header = np.zeros(256, np.int32)
    header[:3] = magic, version, len(tokens)
    with open(path, 'wb') as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype).tobytes())
    return str(path)


def random_shard(path, num_tokens=40_000, vocab=512, kind='gpt2', seed=0, period=331):
    """A random phrase of `period` tokens repeated: a model can learn it, so losses fall."""
    phrase = np.random.default_rng(seed).integers(0, vocab, period)
    return write_shard(path, np.resize(phrase, num_tokens), kind)


def load_config(family='gpt2', variant='tiny', **overrides):
    spec = importlib.util.spec_from_file_location(f'config_{family}', REPO / 'configs' / f'{family}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(variant)
    config.num_devices = 1
    config.update(overrides)
    return config


def metrics_losses(metrics_dir) -> dict[int, float]:
    """{step: loss} from a run's metrics.jsonl ({} where there is none)."""
    metrics = Path(metrics_dir) / 'metrics.jsonl' if metrics_dir else None
    if not (metrics and metrics.exists()):
        return {}
    rows = map(json.loads, metrics.read_text().splitlines())
    return {row['step']: row['loss'] for row in rows if 'loss' in row}


def train(config) -> tuple[int, dict[int, float], str]:
    """Runs the trainer; returns (exit code, {step: loss} from metrics.jsonl, stdout)."""
    from jaxtrain.checks.config_checks import check_config
    from jaxtrain.train import loop as train_lib

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check_config(config)  # as main.py does before it starts the run
        code = train_lib.run(config)
    return code, metrics_losses(config.metrics_dir), out.getvalue()


def train_named(root, name, files, common, **overrides) -> tuple[dict[int, float], str]:
    """A GPT-2 run with its checkpoints and metrics under root/name, from the shard and model
    `files` and the settings `common` (overrides win); asserts it exits 0. Returns
    ({step: loss}, stdout)."""
    config = load_config(
        'gpt2',
        checkpoint_dir=str(Path(root) / name / 'ck'),
        metrics_dir=str(Path(root) / name / 'metrics'),
        **files,
        **{**common, **overrides},
    )
    code, losses, out = train(config)
    assert code == 0, out
    return losses, out


def restore_params(step_dir):
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer().restore(Path(step_dir) / 'params')


def tiny_llmc_model(path, family='gpt2', vocab=512, seed=0, num_layers=2):
    """A small-vocabulary llm.c model file (fast to train on CPU) with random weights, written
    from NumPy (an eager Flax init costs seconds on a busy CPU)."""
    from tiny_models import random_params, tiny_header

    import llmc_io

    header = tiny_header(family, max_seq_len=128, vocab_size=vocab, num_layers=num_layers)
    save = llmc_io.save_gpt2 if family == 'gpt2' else llmc_io.save_llama3
    save(str(path), header, random_params(header, seed))
    return str(path)


def write_checkpoint(root, step, family, header, params, opt_state=None, **record):
    """A committed step holding `params` (a NumPy tree), and `opt_state` (an optax state) when
    given, written by the trainer's own Checkpointer without training: the model config is the
    llmc_io header's fields; `record` adds to (or replaces) trainer-state fields."""
    import dataclasses
    import time

    import jax

    from jaxtrain.checkpoint.manager import Checkpointer

    trainer_state = {
        'step': step,
        'data_position': step,
        'epoch': 0,
        'model_family': family,
        'model_config': dataclasses.asdict(header),
        'training_config': {'optimizer': 'adamw', 'save_optimizer_state': False},
        'dtype': 'float32',
        'topology': {'platform': 'cpu', 'device_count': 1, 'process_count': 1, 'mesh': {'data': 1}},
        'has_optimizer_state': False,
        'saved_at': time.time(),
        **record,
    }
    checkpointer = Checkpointer(str(root), keep_latest=0, keep_every=0)
    on_device = lambda tree: None if tree is None else jax.tree.map(jax.numpy.asarray, tree)
    checkpointer.save(
        step, on_device(params), on_device(opt_state), np.array([0, step], np.uint32), trainer_state
    )
    checkpointer.close()
    return Path(root) / f'checkpoint_step_{step:06d}'


LLMC_RUN_FIXTURE = REPO / 'tests' / 'fixtures' / 'llmc_run'


def llmc_step_as_orbax(root, step, **training):
    """llm.c's own step `step` of tests/fixtures/llmc_run/a (train_gpt2cu -b 4 -t 64 -d 256 on its
    data/) as one of our committed Orbax steps under root, written by write_checkpoint without
    training: its fp32 master weights as params, its m and v as AdamW's moments, and a training
    config an llm.c export takes (`training` adds to it). Returns (the step directory, the params)."""
    import optax

    from llmc_io import llmc_run
    from llmc_io.llmc_state import flat_to_tree

    llmc = llmc_run.read_step(LLMC_RUN_FIXTURE / 'a', step, need_master=True)
    params = flat_to_tree(llmc.state.master, llmc.header)
    adam, *rest = optax.adamw(1e-3).init(params)
    moments = flat_to_tree(llmc.state.m, llmc.header), flat_to_tree(llmc.state.v, llmc.header)
    opt_state = (adam._replace(count=np.int32(step), mu=moments[0], nu=moments[1]), *rest)
    training_config = {
        'optimizer': 'adamw',
        'save_optimizer_state': True,
        'shuffle': 'llmc',
        'input_bin': str(LLMC_RUN_FIXTURE / 'data' / 'tiny_train_*.bin'),
        'batch_size': 4,
        'sequence_length': 64,
        **training,
    }
    step_dir = write_checkpoint(
        root,
        step,
        'gpt2',
        llmc.header,
        params,
        opt_state,
        tokens_per_step=256,
        training_config=training_config,
        has_optimizer_state=True,
    )
    return step_dir, params
