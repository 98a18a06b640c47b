"""What a checkpoint records about a run's inputs besides the model and optimizer settings
(trainer_state.py), and what a resume checks with it: the training data is the one the
checkpoint was trained on, --llmc_filepath, which a resume does not take weights from, is
named as such, and a LoRA checkpoint's base is the one its adapters were trained on.

Data that differs is refused: the saved data position would address other tokens. With
accept_changed_data the run goes on, and the log says what changed.

The LoRA record. A LoRA run's checkpoint holds the adapters (`params/`: h/attn/c_attn/lora_A, ...), their
optimizer state, and the trainer state, which adds a `lora` field: rank, alpha, targets,
the projections they select, the adapter parameter count, and the base model's identity.
The base weights themselves are never written: the base is the llm.c file named by
trainer_state's llmc_file and llmc_sha256, or, without a file, the random init of the
recorded seed and model, whose sha256 (`lora.base_sha256`, params_sha256) is recorded too:
another platform or JAX version could draw other numbers from the same seed. A resume, an
export or generate refuses any other base, naming both hashes.

The data's identity. A resumed run reads window `data_position` of its shards; if the shards changed, that is
another batch (other tokens at the same path and size; a shard cut short, so the run
lands in another epoch; a glob that gained a shard sorting first; the built-in corpus
rebuilt under another Python) and nothing else would notice. The identity is, per shard
in the stream's order: path, size, and a digest that stays cheap for large files:
sha256 over the size and BLOCKS blocks of BLOCK_BYTES at fixed, evenly spread offsets
(first and last included), so a change inside a block that is not sampled can go
unseen. The built-in corpus also records its builder (CORPUS_VERSION, Python version).
"""

import functools
import glob
import hashlib
import os
import platform
from pathlib import Path

from jaxtrain.checkpoint.layout import TRAINER_STATE_FILE, CheckpointError
from jaxtrain.checkpoint.trainer_state import file_sha256


@functools.lru_cache(maxsize=4)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def cached_sha256(path: str) -> str:
    """file_sha256, once per file version in a process (the saver, the resume check and the
    LoRA base check hash the same file)."""
    stat = os.stat(path)
    return _sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def check_data(saved: dict, config, step_dir, recorded_in=None) -> list[str]:
    """Log lines; raises CheckpointError for changed data unless accept_changed_data.
    `recorded_in`: the file holding saved['data'] (default: the step's trainer state)."""
    if 'data' not in saved:  # saved before the data's identity was recorded
        return [f'resume: {step_dir} does not record its data; not checked']
    different, moved = identity_differences(saved['data'], run_data_identity(config))
    recorded_in = recorded_in or Path(step_dir) / TRAINER_STATE_FILE
    lines = [f'resume: data moved: {clause}' for clause in moved]
    if different and not config.accept_changed_data:
        raise CheckpointError(
            f'{step_dir}: data: expected the training data this checkpoint was trained on, found '
            + '; '.join(different)
            + f'. Resume with that data (listed under "data" in {recorded_in}), '
            'or pass --accept_changed_data true to train on this data from the saved position.'
        )
    lines += [f'resume: accept_changed_data: training on changed data: {clause}' for clause in different]
    return lines


def check_weights_file(saved: dict, config, step_dir) -> list[str]:
    """--llmc_filepath on a resume sets the model's shape; the weights are the checkpoint's.
    A LoRA checkpoint holds only adapters: its base weights do come from the file, and
    resume_problems refuses a base whose sha256 differs, so there is nothing to say here."""
    if not config.llmc_filepath or saved.get('lora'):
        return []
    lines = [
        f'resume: the weights come from the checkpoint {step_dir}; --llmc_filepath '
        f'{config.llmc_filepath} only sets the model shape'
    ]
    recorded = saved.get('llmc_sha256')
    if recorded and os.path.isfile(config.llmc_filepath):
        found = cached_sha256(config.llmc_filepath)
        if found != recorded:
            lines.append(
                f"resume: warning: --llmc_filepath {config.llmc_filepath}: sha256 {found[:16]}… differs "
                f"from the file the checkpoint started from ({saved.get('llmc_file') or '?'}, sha256 "
                f'{recorded[:16]}…)'
            )
    return lines


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
    sha_now = cached_sha256(path)
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
        sha_now = cached_sha256(setup.llmc_file)
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
