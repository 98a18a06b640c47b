"""The trainer-state record of a checkpoint: what it holds, reading it back, and
comparing it with the run about to resume from it.

The record is JSON (Orbax's JsonSave, `trainer_state/metadata`): step, data position,
rng, learning rate, model and training config, dtype, topology, library versions, the
llm.c source file and its sha256, and a checksum per tensor (checksums.py).
"""

import hashlib
import json
import platform
import time
from pathlib import Path

from jaxtrain.checkpoint.layout import DAMAGED, TRAINER_STATE_FILE, CheckpointError


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 24), b''):
            digest.update(chunk)
    return digest.hexdigest()


def library_versions() -> dict:
    import flax
    import jax
    import optax
    import orbax.checkpoint

    return {
        'python': platform.python_version(),
        'jax': jax.__version__,
        'flax': flax.__version__,
        'optax': optax.__version__,
        'orbax-checkpoint': orbax.checkpoint.__version__,
    }


def read_trainer_state(step_dir) -> dict:
    path = Path(step_dir) / TRAINER_STATE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f'{path}: expected the trainer state JSON, found no file; {DAMAGED}') from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f'{path}: expected JSON, found unreadable content ({e}); {DAMAGED}') from None


def check_resumable(trainer_state: dict, step_dir) -> None:
    """The record's fields, checked before anything is restored (record_fields.py), so that an
    edited or damaged trainer state is named here rather than failing later without its file."""
    from jaxtrain.checkpoint.record_fields import field_problems

    problems = field_problems(trainer_state, Path(step_dir) / TRAINER_STATE_FILE)
    if problems:
        more = f' (and {len(problems) - 1} more: python -m jaxtrain.ckpt verify {step_dir})'
        more = more if problems[1:] else ''
        raise CheckpointError(f'{problems[0]}{more}; {DAMAGED}')


def trainer_state_record(
    config,
    *,
    step: int,
    data_position: int,
    epoch: int,
    learning_rate: float,
    model_config: dict,
    tokens_per_step: int,
    topology: dict,
    versions: dict,
    llmc_file: str,
    llmc_sha256: str,
    loss: float | None = None,
) -> dict:
    """The trainer_state JSON of one checkpoint (every field `ckpt show` prints), less the
    rng and the per-tensor checksums, which Checkpointer.save adds off the loop."""
    return {
        'step': step,
        'data_position': data_position,
        'epoch': epoch,
        'learning_rate': learning_rate,
        'model_family': config.model_family,
        'model_config': model_config,
        'training_config': config.to_dict(),
        'dtype': config.dtype,
        'tokens_per_step': tokens_per_step,
        'topology': topology,
        'versions': versions,
        'llmc_file': llmc_file,
        'llmc_sha256': llmc_sha256,
        'has_optimizer_state': bool(config.save_optimizer_state),
        'loss': loss,  # the train loss of the saved step (None: not known to the saver)
        'saved_at': time.time(),
    }


# --- compatibility between a checkpoint and the current run -------------------------

# Keys whose change makes the saved state meaningless for this run.
_MUST_MATCH = ('model_family', 'optimizer', 'sequence_length', 'total_batch_size')
# Keys that may change between runs; the change is reported.
_MAY_CHANGE = (
    'learning_rate',
    'lr_schedule',
    'warmup_steps',
    'min_lr_ratio',
    'lr_decay_style',
    'lr_warmup_iters',
    'lr_warmup_init',
    'min_lr',
    'lr_decay_iters',
    'num_iteration',
    'beta1',
    'beta2',
    'eps',
    'weight_decay',
    'grad_clip',
    'dtype',
    'batch_size',
    'input_bin',
    'save_steps',
    'max_checkpoint_keep',
    'keep_every_steps',
    'save_every_minutes',
    'save_optimizer_state',
    'attention',
    'cross_entropy',
    'deterministic',
    'num_devices',
    'mesh_data',
    'mesh_fsdp',
    'mesh_tensor',
    'pipeline_parallel',
    'virtual_pipeline_parallel',
    'val_loss_every',
    'input_val_bin',
)


def compare_with_run(saved: dict, model_config: dict, training_config: dict) -> tuple[list[str], list[str]]:
    """Returns (incompatible fields, allowed changes), each 'field: checkpoint X, now Y'.

    The model family comes first: across families only the shape fields both have are
    compared (the others say nothing a person needs), and within one family a field only
    one side has is named once, not printed as None."""
    incompatible, changes = [], []
    saved_training = saved.get('training_config', {})
    saved_family = saved.get('model_family', saved_training.get('model_family'))
    family = training_config.get('model_family')
    if saved_family != family:
        incompatible.append(f'model_family: checkpoint {saved_family!r}, now {family!r}')
    saved_model = saved.get('model_config', {})
    shared = sorted(set(saved_model) & set(model_config))
    shape_changed = [key for key in shared if saved_model[key] != model_config[key]]
    saved_variant, variant = saved_training.get('model'), training_config.get('model')
    if saved_family == family and shape_changed and saved_variant and saved_variant != variant:
        # The shape fields follow from the variant: name it, and the flag that fixes them all.
        incompatible.append(
            f'model: checkpoint {saved_variant!r}, now {variant!r} (pass --model {saved_variant})'
        )
    for key in shape_changed:
        incompatible.append(f'model_config.{key}: checkpoint {saved_model[key]!r}, now {model_config[key]!r}')
    only_saved, only_now = (
        sorted(set(saved_model) - set(model_config)),
        sorted(set(model_config) - set(saved_model)),
    )
    if saved_family == family and (only_saved or only_now):
        incompatible.append(
            'model_config: fields only in the checkpoint: '
            f"{', '.join(only_saved) or 'none'}; only in this run: {', '.join(only_now) or 'none'}"
        )
    for key in _MUST_MATCH:
        if key != 'model_family' and saved_training.get(key) != training_config.get(key):
            incompatible.append(
                f'{key}: checkpoint {saved_training.get(key)!r}, now {training_config.get(key)!r}'
            )
    # The batch order (data/stream.py): the saved position means another batch in the other one.
    saved_order, order = saved_training.get('shuffle', 'none'), training_config.get('shuffle', 'none')
    if saved_order != order:
        incompatible.append(
            f'shuffle: checkpoint {saved_order!r}, now {order!r} (pass --shuffle {saved_order})'
        )
    for key in _MAY_CHANGE:
        if key in saved_training and saved_training.get(key) != training_config.get(key):
            changes.append(f'{key}: checkpoint {saved_training.get(key)!r}, now {training_config.get(key)!r}')
    return incompatible, changes


def describe_topology(topology: dict) -> str:
    """'8 cpu devices in 1 process, mesh data 2 × fsdp 4 × tensor 1' (fields may be missing
    in older checkpoints: '?')."""
    mesh = ' × '.join(f'{axis} {size}' for axis, size in topology.get('mesh', {}).items()) or '?'
    if topology.get('vpp_size', 1) > 1:  # interleaved pipeline (train/pipeline.py)
        mesh += f", {topology['vpp_size']} chunks per stage"
    return (
        f"{topology.get('device_count', '?')} {topology.get('platform', '?')} device(s) in "
        f"{topology.get('process_count', '?')} process(es), mesh {mesh}"
    )


def topology_change(saved: dict, now: dict) -> str:
    """One clause for the resume line: 'same topology (...)' or 'topology changed: ... -> ...'."""
    fields = ('platform', 'device_count', 'process_count', 'mesh')
    same_chunks = saved.get('vpp_size', 1) == now.get('vpp_size', 1)  # 1 before pipelines existed
    if all(saved.get(f) == now.get(f) for f in fields) and same_chunks:
        return f'same topology ({describe_topology(now)})'
    return f'topology changed: saved on {describe_topology(saved)}, now {describe_topology(now)}'
