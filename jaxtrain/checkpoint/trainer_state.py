"""The trainer-state record of a checkpoint: what it holds, reading it back, and comparing it with the
run about to resume from it.

The record is JSON (Orbax's JsonSave, `trainer_state/metadata`): step, data position, rng, learning
rate, model and training config, dtype, topology, library versions, the llm.c source file and its
sha256, and a checksum per tensor (manager.py).

Its digest, kept in the record itself as `record_sha256`. The per-tensor checksums cover the arrays;
this covers every other field (step, data position, rng, the configs, the data's identity), so that
an edited or damaged record is refused by resume and reported by `ckpt verify` instead of restoring
step 5 from step 4's arrays. The digest is sha256 over the record's canonical JSON (sorted keys, no
spaces) without its own field, so it does not depend on how Orbax's JsonSave formats the file. A
record without the digest is refused too: every record jaxtrain writes has one, so a missing one
means the field was removed with the others edited. The record's step must also be the one its
directory is named after (a copied or renamed step directory is not that step). InfiniTrain step
directories keep the same digest in their "jaxtrain" object.

Its fields' types and ranges, checked before anything uses them. A record whose digest is right can
still hold values no save writes (a copied record, a digest recomputed after an edit, a bug): a step
of 2**40 (the state keeps it as int32), a string for an integer, a list where an object belongs, a
LoRA rank of a billion. Resume used them as they were and failed deep inside with Python's own
words; `ckpt verify` passed them. Both ask field_problems, which names the file, the field, what was
expected and what was found.
"""

import hashlib
import json
import math
import platform
import time
from pathlib import Path

from jaxtrain.checkpoint.layout import DAMAGED, TRAINER_STATE_FILE, CheckpointError, step_of


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
    """The record's fields, checked before anything is restored, so that an edited or damaged
    trainer state is named here rather than failing later without its file."""
    problems = field_problems(trainer_state, Path(step_dir) / TRAINER_STATE_FILE)
    if problems:
        more = f' (and {len(problems) - 1} more: python -m jaxtrain.ckpt verify {step_dir})'
        more = more if problems[1:] else ''
        raise CheckpointError(f'{problems[0]}{more}; {DAMAGED}')


def run_training_config(config, tokens_per_step: int) -> dict:
    """The config as the run uses it, which a record keeps and a resume compares: as given, but
    with the total_batch_size the batch geometry made of it (0, or a default one micro-step
    does not fit into, becomes the tokens of a step)."""
    return {**config.to_dict(), 'total_batch_size': tokens_per_step}


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
        'training_config': run_training_config(config, tokens_per_step),
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
        was = saved_training.get(key)
        if key == 'total_batch_size' and was == 0:  # an older record's "one micro-step"
            was = saved.get('tokens_per_step', was)
        if key != 'model_family' and was != training_config.get(key):
            incompatible.append(f'{key}: checkpoint {was!r}, now {training_config.get(key)!r}')
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


DIGEST_FIELD = 'record_sha256'


def record_digest(record: dict) -> str:
    body = {key: value for key, value in record.items() if key != DIGEST_FIELD}
    canonical = json.dumps(body, sort_keys=True, separators=(',', ':'), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def with_digest(record: dict) -> dict:
    """The record as saved: every field, then its digest (computed last, over all of them)."""
    return {**record, DIGEST_FIELD: record_digest(record)}


def digest_problem(record: dict, step_dir, record_file=None) -> str:
    """'' when the record's digest matches its fields; else one line (also for no digest)."""
    record_file = record_file or Path(step_dir) / TRAINER_STATE_FILE
    recorded = record.get(DIGEST_FIELD)
    if recorded is None:
        return (
            f'{record_file}: {DIGEST_FIELD}: expected the digest jaxtrain writes into every record, found '
            f'none: the field was removed, so the record may have been edited; {DAMAGED}'
        )
    found = record_digest(record)
    if recorded == found:
        return ''
    return (
        f'{record_file}: {DIGEST_FIELD}: expected the digest of the record\'s '
        f'fields, {recorded}, found {found}: the trainer state was edited or damaged after it was saved; '
        f'{DAMAGED}'
    )


def step_name_problem(step, step_dir, record_file=None) -> str:
    """'' when the record's step is the one the directory is named after (or it has no step name)."""
    named = step_of(Path(step_dir))
    is_int = isinstance(step, int) and not isinstance(step, bool)
    if named is None or not is_int or step == named:  # a step that is no integer: record_fields names it
        return ''
    record_file = record_file or Path(step_dir) / TRAINER_STATE_FILE
    return (
        f'{record_file}: step: expected {named}, the step its directory is named after, found {step!r}: '
        f'the directory was renamed or the record edited; {DAMAGED}'
    )


def check_digest(record: dict, step_dir, record_file=None) -> None:
    problem = digest_problem(record, step_dir, record_file) or step_name_problem(
        record.get('step'), step_dir, record_file
    )
    if problem:
        raise CheckpointError(problem)


INT32 = 2**31  # step and data position live in the training state as int32
MAX_LORA_RANK = 2**16  # far above any useful rank, far below an allocation that cannot succeed


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _found(record: dict, key: str) -> str:
    return 'none' if key not in record else repr(record[key])[:120]


def field_problems(record: dict, record_file, only_present: bool = False) -> list[str]:
    """One line per field that no jaxtrain save writes (each: the file, the field, expected,
    found). Fields a record may lack are only checked when present; with only_present, every
    field is (an InfiniTrain step's "jaxtrain" object holds fewer when exported from upstream's)."""
    problems = []

    def problem(key: str, expected: str, found=None):
        if only_present and key.split('.')[0] not in record:
            return
        problems.append(f'{record_file}: {key}: expected {expected}, found {found or _found(record, key)}')

    for key in ('step', 'data_position'):
        value = record.get(key)
        if not (_is_int(value) and 0 <= value < INT32):
            problem(key, 'an integer in [0, 2**31)')
    for key in ('epoch', 'tokens_per_step'):
        if key in record and not (_is_int(record[key]) and 0 <= record[key] < 2**62):
            problem(key, 'an integer >= 0')
    rng = record.get('rng')
    if not (isinstance(rng, list) and rng and all(_is_int(x) and 0 <= x < 2**32 for x in rng)):
        problem('rng', 'a list of uint32 key words')
    for key in ('model_config', 'training_config', 'topology', 'versions', 'checksums'):
        if key in record and not isinstance(record[key], dict):
            problem(key, 'an object')
    model_config = record.get('model_config')
    for name, value in (model_config if isinstance(model_config, dict) else {}).items():
        if _is_int(value) and not 0 <= value < INT32 or isinstance(value, float) and not math.isfinite(value):
            problem(f'model_config.{name}', 'a model dimension in [0, 2**31)', repr(value))
        elif not isinstance(value, (int, float, bool)):  # the model config dataclasses hold no other kind
            problem(f'model_config.{name}', 'a number or true/false', repr(value)[:120])
    checksums = record.get('checksums')
    if isinstance(checksums, dict):
        for item, sums in checksums.items():
            if not isinstance(sums, dict):
                problem(f'checksums.{item}', 'an object of per-tensor checksums', repr(sums)[:120])
    if 'data' in record and not isinstance(record['data'], (dict, type(None))):
        problem('data', 'an object (the training data\'s identity) or null')
    if 'has_optimizer_state' in record and not isinstance(record['has_optimizer_state'], bool):
        problem('has_optimizer_state', 'true or false')
    for key in ('model_family', 'llmc_file', 'llmc_sha256', 'dtype'):
        if key in record and not isinstance(record[key], str):
            problem(key, 'text')
    for key in ('loss', 'best_loss', 'val_loss', 'learning_rate'):
        if record.get(key) is not None and not (_is_int(record[key]) or isinstance(record[key], float)):
            problem(key, 'a number')
    problems += _lora_problems(record, record_file)
    return problems


def _lora_problems(record: dict, record_file) -> list[str]:
    lora = record.get('lora')
    if lora is None:
        return []
    if not isinstance(lora, dict):
        found = repr(lora)[:120]
        return [f"{record_file}: lora: expected an object (the adapters' settings) or null, found {found}"]
    problems = []
    rank = lora.get('rank')
    if not (_is_int(rank) and 1 <= rank <= MAX_LORA_RANK):
        expected = f'an integer in [1, {MAX_LORA_RANK}]'
        problems.append(f'{record_file}: lora.rank: expected {expected}, found {repr(rank)[:60]}')
    if not _is_number(lora.get('alpha')):
        found = repr(lora.get('alpha'))[:60]
        problems.append(f'{record_file}: lora.alpha: expected a finite number, found {found}')
    for key in ('targets', 'modules'):
        value = lora.get(key)
        if key in lora and not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
            problems.append(f'{record_file}: lora.{key}: expected a list of names, found {repr(value)[:60]}')
    return problems
