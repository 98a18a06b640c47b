"""What a LoRA checkpoint records about its adapters and its base, and the checks a resume
makes with it.

A LoRA run's checkpoint holds the adapters (`params/`: h/attn/c_attn/lora_A, ...), their
optimizer state, and the trainer state, which adds a `lora` field: rank, alpha, targets,
the projections they select, the adapter parameter count, and the base model's identity.
The base weights themselves are never written: the base is the llm.c file named by
trainer_state's llmc_file and llmc_sha256, or, without a file, the random init of the
recorded seed and model, whose sha256 (`lora.base_sha256`, params_sha256) is recorded too:
another platform or JAX version could draw other numbers from the same seed. A resume, an
export or generate refuses any other base, naming both hashes.
"""

import functools
import hashlib
import os
from pathlib import Path

from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.checkpoint.trainer_state import file_sha256


@functools.lru_cache(maxsize=4)
def _cached_sha256(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def base_sha256(path: str) -> str:
    """The file's sha256, hashed once per run for the resume check and the saver alike."""
    stat = os.stat(path)
    return _cached_sha256(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


def params_sha256(params) -> str:
    """sha256 over a parameter tree: each tensor's path, dtype, shape and float32 bytes, by path."""
    import jax
    import numpy as np

    digest = hashlib.sha256()
    for path, leaf in sorted(
        (jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    ):
        array = np.ascontiguousarray(jax.device_get(leaf), np.float32)
        digest.update(f'{path}|{array.dtype.str}|{array.shape}|'.encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


_random_base_sha256: dict[int, tuple[object, str]] = {}  # id(params) -> (params, sha256): hashed once a run


def random_base_sha256(params) -> str:
    key = id(params)
    if key not in _random_base_sha256:
        _random_base_sha256.clear()  # one run's base at a time
        _random_base_sha256[key] = (params, params_sha256(params))
    return _random_base_sha256[key][1]


def lora_record(setup, num_parameters: int) -> dict:
    """trainer_state's `lora` field for a run whose model setup has adapters."""
    record = {
        **setup.lora.record(),
        'num_parameters': num_parameters,
        'base': setup.llmc_file or setup.source,  # the base's identity; its weights are not saved
        'base_weights_saved': False,
    }
    import jax

    addressable = all(getattr(x, 'is_fully_addressable', True) for x in jax.tree.leaves(setup.params))
    if not setup.llmc_file and addressable:  # a random init: its hash, to draw it again elsewhere
        record['base_sha256'] = random_base_sha256(setup.params)
    return record


@functools.lru_cache(maxsize=1)
def _drawn_again(family: str, model_config, seed: int, scan_layers: bool) -> tuple[dict, str]:
    """(params, sha256) of the random init, drawn once a process (generate, then export, ...)."""
    from jaxtrain.models.setup import random_init_params

    params = random_init_params(family, model_config, seed, scan_layers=scan_layers)
    return params, params_sha256(params)


def rebuilt_random_base(state: dict, where) -> dict:
    """The random-init base of a LoRA checkpoint, drawn again from its recorded seed and model
    (as models/setup.py draws it) and checked against the recorded sha256."""
    from jaxtrain.models import FAMILIES

    training = state.get('training_config') or {}
    sha_then = (state.get('lora') or {}).get('base_sha256')
    if not sha_then:
        raise CheckpointError(
            f'{where}: lora.base_sha256: expected the hash of the random-init base the adapters were '
            'trained on, found none (saved before it was recorded); resume the run once to save it again'
        )
    family = state.get('model_family')
    config = FAMILIES[family][1](**state.get('model_config'))
    params, sha_now = _drawn_again(
        family, config, training.get('seed'), bool(training.get('scan_layers', True))
    )
    if sha_now != sha_then:
        raise CheckpointError(
            f"{where}: lora.base_sha256: expected the random init of seed {training.get('seed')!r} to "
            f'hash to {sha_then}, found {sha_now} (another platform or JAX version draws other numbers); '
            'merge and export it where it was trained'
        )
    return params


def base_params(state: dict, base: str, where) -> dict:
    """The base a LoRA checkpoint's adapters fold into: its llm.c file (`base` where it is now,
    else the recorded path), checked by sha256, or its random init rebuilt."""
    import llmc_io

    recorded, sha_then = state.get('llmc_file', ''), state.get('llmc_sha256', '')
    if not recorded:
        if base:
            raise CheckpointError(
                f'--base: {base}: expected none, found a file; the adapters were trained on a random '
                'init, which is drawn again from the recorded seed'
            )
        return rebuilt_random_base(state, where)
    path = base or recorded
    if not Path(path).is_file():
        raise CheckpointError(
            f'--base: {path}: expected the base llm.c file (sha256 {sha_then}), found nothing there; '
            'pass --base FILE where it is now'
        )
    sha_now = base_sha256(path)
    if sha_now != sha_then:
        raise CheckpointError(
            f'--base: {path}: expected the base the adapters were trained on ({recorded}, sha256 '
            f'{sha_then}), found sha256 {sha_now}; pass that file with --base'
        )
    training = state.get('training_config') or {}
    if state.get('model_family') == 'llama3':
        overrides = {}
        if training.get('llmc_ffn_dim_multiplier'):
            overrides['ffn_dim_multiplier'] = training['llmc_ffn_dim_multiplier']
        if training.get('llmc_norm_eps'):
            overrides['norm_eps'] = training['llmc_norm_eps']
        return llmc_io.load_llama3(os.fspath(path), **overrides)[1]
    return llmc_io.load_gpt2(os.fspath(path))[1]


def _saved_lora_settings(saved: dict) -> tuple:
    training = saved.get('training_config') or {}
    return (
        training.get('lora_rank', 0),
        training.get('lora_alpha', 16.0),
        training.get('lora_target_modules'),
    )


def resume_problems(saved: dict, config, setup) -> list[str]:
    """'field: checkpoint X, now Y' for each way the LoRA settings or the base model of a
    checkpoint differ from this run (none for two plain runs)."""
    rank_then, alpha_then, targets_then = _saved_lora_settings(saved)
    rank_now = config.lora_rank
    if not rank_then and not rank_now:
        return []
    problems = []
    if rank_then != rank_now:
        kind = lambda rank: f'{rank} (a LoRA run)' if rank else '0 (full fine-tuning)'
        problems.append(f'lora_rank: checkpoint {kind(rank_then)}, now {kind(rank_now)}')
        return problems
    if alpha_then != config.lora_alpha:
        problems.append(f'lora_alpha: checkpoint {alpha_then!r}, now {config.lora_alpha!r}')
    saved_modules = (saved.get('lora') or {}).get('modules')
    if saved_modules is not None and list(saved_modules) != list(setup.lora.modules):
        problems.append(
            f'lora_target_modules: checkpoint {targets_then!r} ({", ".join(saved_modules)}), '
            f'now {config.lora_target_modules!r} ({", ".join(setup.lora.modules)})'
        )
    file_then, sha_then = saved.get('llmc_file', ''), saved.get('llmc_sha256', '')
    if bool(file_then) != bool(setup.llmc_file):
        then = f'{file_then} (sha256 {sha_then})' if file_then else 'a random init'
        now = setup.llmc_file or setup.source
        problems.append(f'base model: checkpoint {then}, now {now}')
    elif setup.llmc_file:
        sha_now = base_sha256(setup.llmc_file)
        if sha_now != sha_then:
            problems.append(
                f'base model (llmc_filepath): the adapters were trained on {file_then} with sha256 '
                f'{sha_then}, '
                f'now {setup.llmc_file} has sha256 {sha_now}'
            )
    elif (saved.get('training_config') or {}).get('seed') != config.seed:
        problems.append(
            f"base model: the random init of seed {(saved.get('training_config') or {}).get('seed')!r}, "
            f'now seed {config.seed!r}'
        )
    else:
        sha_then = (saved.get('lora') or {}).get('base_sha256')
        sha_now = random_base_sha256(setup.params) if sha_then else None
        if sha_then and sha_now != sha_then:
            problems.append(
                f'base model: the random init of seed {config.seed!r} hashed to {sha_then} when saved, '
                f'now to {sha_now} (another platform or JAX version)'
            )
    return problems


def spec_from_record(lora: dict):
    from jaxtrain.models.lora import LoRASpec

    return LoRASpec(int(lora['rank']), float(lora['alpha']), tuple(lora['targets']), tuple(lora['modules']))


def expected_lora_layouts(family: str, model_config, lora: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} of the adapters a LoRA checkpoint of this model holds, from the
    model traced abstractly (no weights, no compilation); model_config is the dataclass."""
    import jax
    import numpy as np
    from flax import nnx

    from jaxtrain.models import FAMILIES
    from jaxtrain.models.lora import LoRAParam

    spec = spec_from_record(lora)
    abstract = nnx.eval_shape(lambda: FAMILIES[family][0](model_config, lora=spec, rngs=nnx.Rngs(0)))
    adapters = nnx.to_pure_dict(nnx.split(abstract, nnx.Param, LoRAParam)[2])
    return {
        '/'.join(str(k.key) for k in path): (tuple(x.shape), np.dtype(x.dtype).name)
        for path, x in jax.tree_util.tree_flatten_with_path(adapters)[0]
    }
