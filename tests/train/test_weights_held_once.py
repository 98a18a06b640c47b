"""A run holds its weights once: in its state. The tree they were read from (here an llm.c
file's, on the host) is let go once the state has them, except in a LoRA run, whose records hash
the frozen base."""

import gc
import weakref

import jax
import numpy as np

from jaxtrain.models import setup as model_setup
from jaxtrain.train.setup import build_trainer
from trainer_runs import load_config


def _build_watching_the_file_tree(monkeypatch, files, **overrides):
    read = model_setup._load_llmc
    watched = {}

    def load_and_watch(config):
        header, params = read(config)
        watched.update(
            (jax.tree_util.keystr(k), weakref.ref(a)) for k, a in jax.tree_util.tree_leaves_with_path(params)
        )
        return header, params

    monkeypatch.setattr(model_setup, '_load_llmc', load_and_watch)
    parts = build_trainer(load_config(llmc_filepath=files['llmc_filepath'], batch_size=2, **overrides))
    gc.collect()
    return parts, watched


def test_a_full_run_lets_go_of_the_tree_its_weights_came_from(monkeypatch, files):
    parts, watched = _build_watching_the_file_tree(monkeypatch, files)
    state = {jax.tree_util.keystr(k): a for k, a in jax.tree_util.tree_leaves_with_path(parts.state.params)}
    # Gone, or the state's own buffer (JAX on a CPU may take an aligned host array without a copy).
    alive = [name for name, ref in watched.items() if ref() is not None]
    assert watched and all(
        state[name].unsafe_buffer_pointer() == watched[name]().ctypes.data for name in alive
    )
    assert len(alive) < len(watched)
    # what replaced it says the shapes, and the state holds the weights
    for shape, array in zip(jax.tree.leaves(parts.setup.params), jax.tree.leaves(parts.state.params)):
        assert (shape.shape, shape.dtype) == (array.shape, array.dtype)
    assert all(np.all(np.isfinite(np.asarray(a))) for a in jax.tree.leaves(parts.state.params))


def test_a_lora_run_keeps_its_base(monkeypatch, files):
    parts, watched = _build_watching_the_file_tree(monkeypatch, files, lora_rank=2)
    assert watched and all(ref() is not None for ref in watched.values())
    assert all(isinstance(a, np.ndarray) for a in jax.tree.leaves(parts.setup.params))
