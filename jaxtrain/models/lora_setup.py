"""Giving a model setup its LoRA adapters (lora.py), and moving them to and from
InfiniTrain's LoRA weights file (llmc_io/infinitrain/lora_weights.py).

InfiniTrain names a tensor by its module path: `transformer.h.{i}.attn.c_attn.lora_A` is
layer i's A of attention's c_attn, shaped (r, in) as ours; our tree stacks the L layers.
Our arrays are the logical (whole) tensors on any mesh, which is what PR 150's writer
gathers its TP shards into: c_attn's B rows are [Q | K | V] as in the base kernel, so a file
from any TP size loads on any mesh, and ours is the one a TP 1 run would write.
"""

import dataclasses
import re

import jax
import numpy as np
from flax import nnx

from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.lora_weights import (
    ordered_for_layout,
    read_lora_weights,
    without_ddp_prefix,
    write_lora_weights,
)
from jaxtrain.models.lora import PROJECTIONS, LoRAParam, init_lora_params, resolve_spec

_UPSTREAM_NAME = re.compile(r'^transformer\.h\.(\d+)\.(\w+)\.(\w+)\.(lora_A|lora_B)$')


def attach_lora(config, setup, model_cls, options: dict):
    """`setup` with adapters when config.lora_rank > 0 (else unchanged): the graphdef of the
    model with LoRALinear on the targets, the initial (or loaded) LoRA tree, and the spec."""
    spec = resolve_spec(config, setup.params, config.model_family)
    if spec is None:
        return setup
    abstract = nnx.eval_shape(lambda: model_cls(setup.model_config, **options, lora=spec, rngs=nnx.Rngs(0)))
    graphdef, _, abstract_lora = nnx.split(abstract, nnx.Param, LoRAParam)
    lora_params = init_lora_params(nnx.to_pure_dict(abstract_lora), config.seed)
    source = setup.source
    if config.lora_load_path:
        lora_params = load_upstream_lora(config.lora_load_path, lora_params, spec)
        source += f' + LoRA weights {config.lora_load_path}'
    return dataclasses.replace(setup, graphdef=graphdef, lora=spec, lora_params=lora_params, source=source)


def upstream_tensors(lora_params: dict) -> list[tuple[str, np.ndarray]]:
    """(InfiniTrain name, array) for every layer's A and B, by layer then module (the order
    the head layout writes; b24d92f's own is an unordered_map's, which no reader relies on)."""
    rows = []
    for group, modules in lora_params['h'].items():
        for name, pair in modules.items():
            for which in ('lora_A', 'lora_B'):
                stacked = np.asarray(jax.device_get(pair[which]), np.float32)
                rows += [
                    (f'transformer.h.{i}.{group}.{name}.{which}', stacked[i]) for i in range(len(stacked))
                ]
    layer_of = lambda row: int(row[0].split('.')[2])
    return sorted(rows, key=lambda row: (layer_of(row), row[0]))


def load_upstream_lora(path: str, like: dict, spec) -> dict:
    """The LoRA tree of `like`'s structure from the file; anything that does not fit the
    model or the targets (a name, a rank, a shape) is one line naming the file and flag."""
    expected = dict(upstream_tensors(like))
    try:
        found = read_lora_weights(path)
    except LLMCFormatError as e:
        raise ValueError(f'lora_load_path: {e}') from None
    found = [(without_ddp_prefix(name, expected), array) for name, array in found]
    names = [name for name, _ in found]
    problems = []
    for name in names:
        if name not in expected:
            match = _UPSTREAM_NAME.match(name)
            module = f'{match.group(2)}.{match.group(3)}' if match else ''
            if module in PROJECTIONS and module not in spec.modules:
                problems.append(
                    f'{name}: adapts {module}, which lora_target_modules {",".join(spec.targets)} does not '
                    f'select (it selects {", ".join(spec.modules)})'
                )
            else:
                problems.append(f'{name}: not a LoRA tensor of this model')
    missing = [name for name in expected if name not in names]
    if missing:
        problems.append(f'{len(missing)} tensor(s) of this model missing, e.g. {missing[0]}')
    for name, array in found:
        if name in expected and array.shape != expected[name].shape:
            problems.append(
                f'{name}: expected shape {expected[name].shape} (rank {spec.rank}), found {array.shape}'
            )
    if len(set(names)) != len(names):
        problems.append('a tensor name appears twice')
    if problems:
        raise ValueError(
            f'lora_load_path: {path}: does not fit this model and its LoRA targets: {problems[0]}'
            + (f' (and {len(problems) - 1} more problem(s))' if len(problems) > 1 else '')
            + '; pass the --lora_rank and --lora_target_modules it was trained with, and its base model'
        )
    values = dict(found)

    def stacked(path, leaf):
        group, name, which = path[-3].key, path[-2].key, path[-1].key
        layers = [values[f'transformer.h.{i}.{group}.{name}.{which}'] for i in range(leaf.shape[0])]
        return np.stack(layers).astype(np.float32)

    return jax.tree_util.tree_map_with_path(stacked, like)


def save_lora_weights(path: str, lora_params: dict, layout: str = 'master') -> str:
    """--lora_save_path at the end of a run (process 0 writes) in --lora_save_layout's layout
    (llmc_io/infinitrain/lora_weights.py); returns the log line."""
    if jax.process_count() > 1:  # adapters sharded over fsdp span processes: gather them whole
        from jax.experimental import multihost_utils

        lora_params = multihost_utils.process_allgather(lora_params, tiled=True)
    tensors = ordered_for_layout(upstream_tensors(lora_params), layout)
    if jax.process_index() == 0:
        try:
            write_lora_weights(
                path, tensors
            )  # a temporary name, then a rename: the old file stays on failure
        except OSError as e:
            raise OSError(
                f'lora_save_path: {path}: could not write the adapters: {e.strerror or e}; what was there is '
                'unchanged. Free space (or fix the path) and run again'
            ) from None
    return (
        f'lora_save_path: wrote {len(tensors)} LoRA tensors to {path} '
        f"(InfiniTrain's LoRA weights format, {layout} layout)"
    )
