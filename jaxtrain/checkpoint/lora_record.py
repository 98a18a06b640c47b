"""What a LoRA checkpoint records about its adapters and its base, and the checks a resume
makes with it.

A LoRA run's checkpoint holds the adapters (`params/`: h/attn/c_attn/lora_A, ...), their
optimizer state, and the trainer state, which adds a `lora` field: rank, alpha, targets,
the projections they select, the adapter parameter count, and the base model's identity.
The base weights themselves are never written: the base is the llm.c file named by
trainer_state's llmc_file and llmc_sha256 (or, without a file, the random init of the
recorded seed), and a resume or an export refuses any other file, naming both hashes.
"""

import functools
import os

from jaxtrain.checkpoint.trainer_state import file_sha256


@functools.lru_cache(maxsize=4)
def _cached_sha256(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def base_sha256(path: str) -> str:
    """The file's sha256, hashed once per run for the resume check and the saver alike."""
    stat = os.stat(path)
    return _cached_sha256(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


def lora_record(setup, num_parameters: int) -> dict:
    """trainer_state's `lora` field for a run whose model setup has adapters."""
    return {
        **setup.lora.record(),
        'num_parameters': num_parameters,
        'base': setup.llmc_file or setup.source,  # the base's identity; its weights are not saved
        'base_weights_saved': False,
    }


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
