"""--init_from PATH: start a run from another run's weights only, with a fresh optimizer, learning
rate schedule and data position (torchtitan's initial_load_model_only).

PATH is any kind `ckpt ls` knows, or an HF folder:
- a jaxtrain (Orbax) checkpoint_step_NNNNNN directory, or a checkpoint root (its newest committed step);
- an InfiniTrain step directory (HEAD model.ckpt, PR model.bin / model.pth, rank_* subdirectories);
- a Hugging Face GPT2LMHeadModel / LlamaForCausalLM folder (config.json + model.safetensors);
- an llm.c model file, or an llm.c run folder (train_gpt2cu -o DIR: its newest committed step's model).

The run's model is the one its flags name (--model); the weights must fit it, tensor for tensor.
A mismatch is refused in one line naming both models (the source's by its variant name where one
has its shape) and the first difference. GPT-2 files that hold V rows of wte (InfiniTrain's
SaveAsLLMC) get the padding rows up to the run's Vp as zeros, as llm.c pads them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from jaxtrain.checkpoint import layout


def _restore_orbax_params(step_dir: Path) -> dict:
    import jax
    import orbax.checkpoint as ocp

    item_dir = step_dir.absolute() / 'params'
    try:
        metadata = ocp.PyTreeCheckpointer().metadata(item_dir).item_metadata.tree
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
        return ocp.PyTreeCheckpointer().restore(item_dir, args=ocp.args.PyTreeRestore(restore_args=as_numpy))
    except Exception as e:  # noqa: BLE001  Orbax raises many kinds for a damaged directory
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise layout.CheckpointError(
            f'init_from: {item_dir}: could not read the saved weights: {first}'
        ) from e


def _orbax_step(path: Path) -> Path | None:
    """The step directory PATH names: itself, or a root's newest committed step."""
    if layout.is_committed(path):
        return path
    steps = layout.committed_steps(path)
    return path / layout.step_dir_name(steps[-1]) if steps else None


def read_init_weights(path: str) -> tuple[str, dict, str, object]:
    """(model family, params as a NumPy tree, what they are, their model config or None) of PATH."""
    import llmc_io
    from llmc_io import llmc_run
    from llmc_io.hf import is_hf_folder, load_hf

    from jaxtrain.checkpoint.formats import infinitrain as it
    from jaxtrain.checkpoint.trainer_state import read_trainer_state

    where = Path(path)
    if is_hf_folder(where):
        header, params = load_hf(where)
        return _family_of(header), params, f'Hugging Face folder {where}', _model_of(header)
    if where.is_file():
        header, params = llmc_io.load_model(where)
        return _family_of(header), params, f'llm.c file {where}', _model_of(header)
    if not where.is_dir():
        raise layout.CheckpointError(
            f'init_from: {where}: expected a checkpoint step directory, a checkpoint root, a Hugging Face '
            'folder or an llm.c file, found nothing there'
        )
    if llmc_run.is_run_dir(where):  # its newest committed step's model file
        from jaxtrain.checkpoint.formats.llmc_run import locate

        run_dir, step = locate(where)
        header, params = llmc_io.load_model(llmc_run.model_path(run_dir, step))
        return _family_of(header), params, f'llm.c run folder {run_dir}, step {step}', _model_of(header)
    kind = it.detect_kind(where)
    if kind is not None:
        read = it.read_checkpoint(where, None, with_optimizer=False)
        return read.family, read.params, f'InfiniTrain checkpoint {where} ({kind})', None
    step_dir = _orbax_step(where)
    if step_dir is None:
        raise layout.CheckpointError(
            f'init_from: {where}: expected a checkpoint step directory, a checkpoint root with a committed '
            'step, an llm.c run folder or a Hugging Face folder (config.json), found none of them'
        )
    state = read_trainer_state(step_dir)
    if state.get('lora'):
        raise layout.CheckpointError(
            f'init_from: {step_dir}: expected full weights, found LoRA adapters only; merge them first with '
            f'python -m jaxtrain.ckpt export {step_dir} --merge-lora --output merged.bin'
        )
    family, recorded = state.get('model_family'), state.get('model_config') or {}
    model = _model_of_fields(family, recorded)
    return family, _restore_orbax_params(step_dir), f'checkpoint {step_dir}', model


def _model_of_fields(family: str, fields: dict):
    """The family's model config holding these fields, or None (an unknown family or field)."""
    from jaxtrain.models import FAMILIES

    if family not in FAMILIES:
        return None
    config_cls = FAMILIES[family][1]
    names = {field.name for field in dataclasses.fields(config_cls)}
    try:
        return config_cls(**{key: value for key, value in fields.items() if key in names})
    except (TypeError, ValueError):
        return None


def _model_of(header):
    """The model config of an llmc_io header (the two share their field names)."""
    return _model_of_fields(_family_of(header), dataclasses.asdict(header))


def _model_name(family: str, model) -> str | None:
    """The first of the family's --model variants with exactly this shape, if one has it."""
    from jaxtrain.models import FAMILIES

    variants = FAMILIES[family][2]
    return next((name for name, variant in variants.items() if variant == model), None)


def _mismatch_line(config, family: str, what: str, model, problems: list[str]) -> str:
    """One line naming the source's model and the run's, with the first of the differences."""
    name = _model_name(family, model) if model is not None else None
    held = f"{family} model '{name}'" if name else f'a {family} model that no --model variant matches'
    fix = f'pass --model {name}' if name else 'pass the --model its weights were trained as'
    if name is None and what.startswith('llm.c file '):
        fix += f", or --llmc_filepath {what.removeprefix('llm.c file ')} (its header sets the model)"
    return (
        f"init_from: {what} holds {held}, this run's --model is '{config.model}' "
        f"({len(problems)} tensors differ, first {problems[0]}); {fix}"
    )


def _family_of(header) -> str:
    import llmc_io

    return 'gpt2' if isinstance(header, llmc_io.GPT2Header) else 'llama3'


def pad_vocabulary_rows(params: dict, expected: dict) -> dict:
    """GPT-2's wte with V rows, where the run's model has Vp: zero rows appended (llm.c's padding)."""
    wte, want = params.get('wte', {}).get('embedding'), expected.get('wte', {}).get('embedding')
    if wte is None or want is None or 'wpe' not in params:
        return params
    rows, want_rows = np.shape(wte)[0], tuple(want.shape)[0]
    if rows < want_rows and np.shape(wte)[1:] == tuple(want.shape)[1:]:
        padding = np.zeros((want_rows - rows, *np.shape(wte)[1:]), np.asarray(wte).dtype)
        params = {**params, 'wte': {**params['wte'], 'embedding': np.concatenate([np.asarray(wte), padding])}}
    return params


def apply_init_from(config, setup):
    """The model setup (models/setup.py) with its weights replaced by --init_from's, checked to fit."""
    import jax

    from jaxtrain.models.setup import shape_mismatches

    family, params, what, model = read_init_weights(config.init_from)
    if family != config.model_family:
        raise layout.CheckpointError(
            f'init_from: {what}: expected {config.model_family} weights (the config file\'s family), '
            f'found {family}; train it with configs/{family}.py'
        )
    params = pad_vocabulary_rows(params, setup.params)
    problems = shape_mismatches(setup.params, params)
    if problems:
        raise layout.CheckpointError(_mismatch_line(config, family, what, model, problems))
    # On the host, as models/setup.py keeps an llm.c file's: put_global splits each tensor there
    # for its devices, where a device array would be sliced on device 0 by compiled programs.
    weights = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
    source = f'{what}, weights only (--init_from: fresh optimizer, schedule and data position)'
    return dataclasses.replace(setup, params=weights, source=source)
