"""Where a run's weights come from when it starts from a checkpoint: a resume (everything) or
--init_from (the weights only).

Resuming: which step directory to resume from, and `resume_into`, the one call the training
loop makes; the step's format (registry.py) checks and restores it.

Resume order: an explicit `resume_from` step directory, or `latest` (the newest committed
step in checkpoint_dir), else the llm.c file the run was given, else random init (the
last two are model setup's, models/setup.py).

Topology: arrays are saved sharded as they live on the mesh and restored onto the current
run's shardings whatever the saving mesh was (8 devices -> 1, 1 -> 8, FSDP -> data
parallel); the resume line names what changed.

--init_from PATH: start a run from another run's weights only, with a fresh optimizer, learning
rate schedule and data position (torchtitan's initial_load_model_only).

PATH is any kind `ckpt ls` knows, or an HF folder (read_weights, which generate reads with too):
- a checkpoint_step_NNNNNN directory of any format the registry knows (Orbax; InfiniTrain's HEAD
  model.ckpt, PR model.bin / model.pth, rank_* subdirectories), or a checkpoint root (its newest
  committed step, of whichever kind);
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

from jaxtrain.checkpoint import layout, registry
from jaxtrain.checkpoint.format import Resumed
from jaxtrain.checkpoint.layout import CheckpointError


def resolve_resume(
    resume_from: str, checkpoint_dir: str, checkpoint_format: str = registry.ORBAX.name
) -> tuple[Path | None, str]:
    """Returns (step directory or None, a notice for the log). `latest` is the newest step
    of checkpoint_format's kind; an explicit step directory may be of any kind."""
    if not resume_from:
        return None, ''
    if resume_from == 'latest':
        if not checkpoint_dir:
            raise CheckpointError(
                "resume_from: 'latest' needs checkpoint_dir; found checkpoint_dir empty. "
                'Pass --checkpoint_dir DIR.'
            )
        fmt = registry.for_flag(checkpoint_format)
        steps = fmt.committed_steps(checkpoint_dir)
        if not steps:
            registry.refuse_other_kind_for_latest(checkpoint_dir, fmt)
            return None, f'resume_from=latest: no committed checkpoint in {checkpoint_dir}; starting fresh'
        # Absolute: Orbax refuses relative paths, and the README's commands use them.
        return Path(fmt.step_path(checkpoint_dir, steps[-1])).absolute(), ''
    path = Path(resume_from).absolute()
    return registry.for_step_dir(path).resume_step(path), ''


def resume_into(config, parts) -> Resumed:
    """Resolves config.resume_from, and has the step's format check it against the run
    before anything is touched (every incompatibility at once) and restore it onto the
    run's shardings. `parts` is train/setup.py's TrainerSetup; its fresh state is returned
    unchanged when there is nothing to resume."""
    step_dir, notice = resolve_resume(
        config.resume_from,  # HEAD's --load arrives here too (config/infinitrain_flags.py)
        config.checkpoint_dir,
        config.get('checkpoint_format', registry.ORBAX.name),
    )
    messages = [notice] if notice else []
    if step_dir is None:
        return Resumed(parts.state, None, None, messages)
    resumed = registry.for_step_dir(step_dir).restore_into(config, parts, step_dir)
    resumed.messages[:0] = messages
    return resumed


def read_weights(path, flag: str, lora_base: str | None = None):
    """The weights PATH holds, on the host (format.Weights): any step (or a root's newest committed
    step) of a format the registry knows, verified by that format first and read by it; else an HF
    folder or an llm.c file. A LoRA checkpoint's adapters are folded into their base when lora_base
    is given ('' = the recorded base), else refused. Errors are one line starting with `flag`."""
    try:
        return _read_weights(Path(path), flag, lora_base)
    except layout.CheckpointError as e:
        text = str(e)
        raise layout.CheckpointError(text if text.startswith(f'{flag}: ') else f'{flag}: {text}') from None


def _read_weights(where: Path, flag: str, lora_base: str | None):
    import llmc_io
    from llmc_io.hf import is_hf_folder, load_hf

    from jaxtrain.checkpoint.format import Weights

    fmt = None
    if where.is_dir() or registry.LLMC_RUN.owns(where):
        fmt = registry.for_step_dir(where)
        if not fmt.owns(where):  # the fallback: no format's step
            # A root's newest step, even with other files beside its steps (an HF export forced there).
            where, fmt = registry.newest_step(where) or (where, None)
    if fmt is None:
        if is_hf_folder(where):
            header, params = load_hf(where)
            return Weights(_family_of(header), params, f'Hugging Face folder {where}', _fields(header))
        if where.is_file():
            header, params = llmc_io.load_model(where)
            return Weights(_family_of(header), params, f'llm.c file {where}', _fields(header))
        if not where.is_dir():
            raise layout.CheckpointError(
                f'{where}: expected a checkpoint step directory, a checkpoint root, a Hugging Face '
                'folder or an llm.c file, found nothing there'
            )
        raise layout.CheckpointError(_not_a_checkpoint(where))
    registry.refuse_damaged(where, flag)
    weights = fmt.read_weights(where)
    lora = (weights.record or {}).get('lora')
    if lora and lora_base is None:
        raise layout.CheckpointError(
            f'{where}: expected full weights, found LoRA adapters only; merge them first with '
            f'python -m jaxtrain.ckpt export {where} --merge-lora --output merged.bin'
        )
    if lora:
        from jaxtrain.checkpoint.resume_checks import base_params
        from jaxtrain.models.lora import merged_params

        base = base_params(weights.record, lora_base, where)
        merged = merged_params(base, weights.params, lora)
        on = lora_base or weights.record.get('llmc_file') or 'the random init of its seed'
        what = f"{weights.what} (LoRA rank {lora.get('rank')} on {on})"
        return dataclasses.replace(weights, params=merged, what=what)
    return weights


def _not_a_checkpoint(where: Path) -> str:
    steps = [where] + (sorted(p for p in where.iterdir() if p.is_dir()) if where.is_dir() else [])
    for step in steps:
        try:
            registry.for_step_dir(step)
        except CheckpointError as e:  # a format's step it cannot read as it is (gzipped files)
            return str(e)
    return (
        f'{where}: expected a checkpoint step directory, a checkpoint root with a committed step, an '
        'llm.c run folder or a Hugging Face folder (config.json), found none of them'
    )


def read_init_weights(path: str) -> tuple[str, dict, str, object]:
    """(model family, params as a NumPy tree, what they are, their model config or None) of PATH,
    for --init_from."""
    weights = read_weights(path, 'init_from')
    model = _model_of_fields(weights.family, weights.model_config) if weights.model_config else None
    return weights.family, weights.params, weights.what, model


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


def _variant_with_shapes(family: str, params: dict) -> str | None:
    """The first --model variant whose tensors have these shapes (a GPT-2 wte of V or Vp rows), for
    a source that records no model config (an InfiniTrain step: its heads are not in its shapes)."""
    import llmc_io
    from llmc_io.tensors import tree_leaves

    from jaxtrain.models import FAMILIES

    header_cls = llmc_io.GPT2Header if family == 'gpt2' else llmc_io.LLaMA3Header
    fields = {field.name for field in dataclasses.fields(header_cls)}
    found = {path: tuple(np.shape(leaf)) for path, leaf in tree_leaves(params).items()}
    for name, variant in FAMILIES[family][2].items():
        try:
            header = header_cls(**{k: v for k, v in dataclasses.asdict(variant).items() if k in fields})
        except TypeError:  # a field the header needs that the variant does not give
            continue
        expected = dict(header.param_shapes())
        if family == 'gpt2' and found.get('wte/embedding', (0,))[0] == header.vocab_size:
            expected['wte/embedding'] = (header.vocab_size, header.channels)
        if expected == found:
            return name
    return None


def _mismatch_line(config, family: str, what: str, model, problems: list[str], params: dict) -> str:
    """One line naming the source's model and the run's, with the first of the differences."""
    name = _model_name(family, model) if model is not None else _variant_with_shapes(family, params)
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


def _fields(header) -> dict:
    return dataclasses.asdict(header)


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
        raise layout.CheckpointError(_mismatch_line(config, family, what, model, problems, params))
    # On the host, as models/setup.py keeps an llm.c file's: put_global splits each tensor there
    # for its devices, where a device array would be sliced on device 0 by compiled programs.
    weights = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
    source = f'{what}, weights only (--init_from: fresh optimizer, schedule and data position)'
    return dataclasses.replace(setup, params=weights, source=source)
