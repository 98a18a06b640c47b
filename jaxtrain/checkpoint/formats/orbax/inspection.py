"""Reading checkpoints without the trainer: list a root, restore items as NumPy, verify.

Nothing here builds or runs a model. Arrays are restored as host NumPy arrays through the Orbax
metadata, so a checkpoint saved on any number of devices reads on one CPU; shapes, dtypes and the
sharding an array was saved with come from the same metadata without reading data. Tensor names are
those of manager.py's checksums ('h/attn/c_attn/kernel', '0/mu/wte/embedding'), the names under which
trainer_state records a checksum. Every problem that stops a command is a CheckpointError (one line).
"""

import collections
import concurrent.futures
import dataclasses
import os
import re
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from llmc_io.llama3_header import HF_ONLY_FIELDS
from jaxtrain.checkpoint.manager import checksum_mismatches, host_checksum, path_name
from jaxtrain.checkpoint.format import Verification
from jaxtrain.checkpoint.layout import (
    STEP_PREFIX,
    TRAINER_STATE_FILE,
    CheckpointError,
    committed_steps,
    is_committed,
    step_dir_name,
    step_dir_names,
    step_of,
)
from jaxtrain.checkpoint.trainer_state import DIGEST_FIELD, digest_problem, step_name_problem
from jaxtrain.checkpoint.trainer_state import field_problems
from jaxtrain.checkpoint.trainer_state import read_trainer_state

ARRAY_ITEMS = ('params', 'opt_state')
# Orbax writes a step into `<final name>.orbax-checkpoint-tmp-<n>` and renames it when complete.
_TMP_STEP_DIR = re.compile(rf'^{STEP_PREFIX}_(\d+)\.orbax-checkpoint-tmp')


# --- where the checkpoints are --------------------------------------------------------


@dataclasses.dataclass
class StepEntry:
    """One checkpoint directory under a root, as `ls` shows it."""

    step: int
    path: Path
    committed: bool
    status: str  # committed | uncommitted: Orbax temporary directory | incomplete: no trainer_state
    size_bytes: int
    written_at: float  # seconds since the epoch
    written_from: str  # trainer_state (its saved_at) | mtime (no readable trainer state)
    has_optimizer_state: bool
    loss: float | None = None  # the train loss of the saved step (trainer_state; older ones lack it)


def _size_on_disk(path: Path) -> int:
    return sum((Path(folder) / name).lstat().st_size for folder, _, names in os.walk(path) for name in names)


def _step_entry(path: Path, step: int, temporary: bool) -> StepEntry:
    committed = not temporary and is_committed(path)
    written_at, written_from = path.stat().st_mtime, 'mtime'
    has_optimizer_state = (path / 'opt_state').is_dir()
    loss = None
    if committed:
        try:
            state = read_trainer_state(path)
            written_at, written_from = float(state['saved_at']), 'trainer_state'
            has_optimizer_state = bool(state.get('has_optimizer_state', has_optimizer_state))
            loss = state.get('loss') if isinstance(state.get('loss'), (int, float)) else None
        except (CheckpointError, KeyError, TypeError, ValueError):
            pass  # listed from the directory alone; `verify` says what is wrong
    if temporary:
        status = 'uncommitted: Orbax temporary directory'
    elif not committed:
        status = f'incomplete: no {TRAINER_STATE_FILE}'
    else:
        status = 'committed'
    return StepEntry(
        step,
        path,
        committed,
        status,
        _size_on_disk(path),
        written_at,
        written_from,
        has_optimizer_state,
        loss,
    )


def list_checkpoints(root) -> tuple[list[StepEntry], int | None]:
    """(every step directory, finished or not, by step; the step `--resume_from latest` would pick)."""
    root = Path(root)
    if not root.exists():
        raise CheckpointError(f'{root}: expected a checkpoint root directory, found nothing there')
    if not root.is_dir():
        raise CheckpointError(f'{root}: expected a checkpoint root directory, found a file')
    if step_of(root) is not None or _TMP_STEP_DIR.match(root.name):
        raise CheckpointError(
            f'{root}: expected a checkpoint root, found a step directory; list its parent {root.parent}'
        )
    entries = []
    for path in root.iterdir():
        temporary = _TMP_STEP_DIR.match(path.name)
        step = int(temporary.group(1)) if temporary else step_of(path)
        if step is not None and path.is_dir():
            entries.append(_step_entry(path, step, bool(temporary)))
    if not entries:
        raise CheckpointError(
            f'{root}: expected a checkpoint root holding {STEP_PREFIX}_NNNNNN directories, found none'
        )
    entries.sort(key=lambda e: (e.step, e.committed))
    steps = committed_steps(root)
    return entries, (steps[-1] if steps else None)


def find_step_dir(path) -> Path:
    """`path` itself when it is one checkpoint step; otherwise a CheckpointError that says what it is."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f'{path}: expected a {STEP_PREFIX}_NNNNNN directory, found nothing there')
    if not path.is_dir():
        raise CheckpointError(f'{path}: expected a {STEP_PREFIX}_NNNNNN directory, found a file')
    holds_items = any((path / item).exists() for item in (*ARRAY_ITEMS, 'trainer_state'))
    if step_of(path) is not None or _TMP_STEP_DIR.match(path.name) or holds_items:
        return path
    steps = committed_steps(path)
    if steps:
        raise CheckpointError(
            f'{path}: expected a step directory, found a checkpoint root holding '
            f'{step_dir_names(steps)}; '
            f'pass one of them, e.g. {path / step_dir_name(steps[-1])}'
        )
    raise CheckpointError(
        f'{path}: expected a {STEP_PREFIX}_NNNNNN directory (params/, trainer_state/ inside), '
        'found a directory that is not a checkpoint'
    )


def is_temporary(step_dir: Path) -> bool:
    return bool(_TMP_STEP_DIR.match(Path(step_dir).name))


def find_finished_step_dir(path) -> Path:
    """find_step_dir, refusing an Orbax temporary directory (a save that never finished)."""
    step_dir = find_step_dir(path)
    if is_temporary(step_dir):
        raise CheckpointError(
            f'{step_dir}: expected a committed checkpoint, found an Orbax temporary directory (a save '
            f'that never finished); pick a committed step (python -m jaxtrain.ckpt ls {step_dir.parent})'
        )
    return step_dir


# --- the arrays ------------------------------------------------------------------------


@dataclasses.dataclass
class TensorLayout:
    shape: tuple[int, ...]
    dtype: str
    sharding: str  # as saved, e.g. "mesh(data=8) P('data',)"; 'n/a' when Orbax recorded none


def _item_dir(step_dir: Path, item: str) -> Path:
    item_dir = Path(step_dir).absolute() / item  # Orbax refuses relative paths
    if not item_dir.is_dir():
        raise CheckpointError(f'{item_dir}: expected the {item} item (an Orbax directory), found nothing')
    return item_dir


def flatten(tree) -> dict:
    """{tensor name: leaf}, named as manager.py's checksums name them."""
    return {path_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _metadata_tree(item_dir: Path):
    try:
        metadata = ocp.PyTreeCheckpointer().metadata(item_dir).item_metadata
    except Exception as e:  # Orbax raises many kinds for a damaged directory
        raise CheckpointError(f'{item_dir}: could not read the Orbax metadata: {first_line(e)}') from e
    if metadata is None:  # what Orbax returns when _METADATA is missing or unreadable
        raise CheckpointError(f'{item_dir}: expected Orbax tree metadata (_METADATA), found none readable')
    return metadata.tree


# An item is read this many bytes of arrays at a time (one array at least): tensorstore reads an
# array into a buffer of its own before handing a copy over, so a whole-item read held the item
# twice, 64 GB for an 8B model's fp32 params.
READ_GROUP_BYTES = 1 << 30


def _read_groups(leaves) -> list[list[int]]:
    """The leaves' indices in runs of at most READ_GROUP_BYTES (by their metadata's shape and dtype)."""
    groups, size = [[]], 0
    for i, meta in enumerate(leaves):
        nbytes = (
            int(np.prod(getattr(meta, 'shape', ()))) * np.dtype(getattr(meta, 'dtype', None) or 'u1').itemsize
        )
        if groups[-1] and size + nbytes > READ_GROUP_BYTES:
            groups, size = groups + [[]], 0
        groups[-1].append(i)
        size += nbytes
    return groups


def each_array(step_dir, item: str):
    """Yields (tensor name, NumPy array) for every array of the item, read READ_GROUP_BYTES at a
    time through Orbax's placeholders, so a caller that lets go of each holds about one group."""
    item_dir = _item_dir(step_dir, item)
    metadata = _metadata_tree(item_dir)
    leaves, structure = jax.tree_util.tree_flatten(metadata)
    names = list(flatten(metadata))
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    for group in _read_groups(leaves):
        wanted = [ocp.PLACEHOLDER] * len(leaves)
        for i in group:
            wanted[i] = 0  # anything but the placeholder is read
        selected = ocp.args.PyTreeRestore(
            item=jax.tree_util.tree_unflatten(structure, wanted), restore_args=as_numpy
        )
        try:
            restored = jax.tree_util.tree_leaves(ocp.PyTreeCheckpointer().restore(item_dir, args=selected))
        except Exception as e:
            raise CheckpointError(f'{item_dir}: could not restore the saved arrays: {first_line(e)}') from e
        for i in group:
            yield names[i], restored[i]
        del restored


def restore_item(step_dir, item: str):
    """The item's tree with every array as NumPy on the host, whatever devices saved it."""
    structure = jax.tree_util.tree_structure(_metadata_tree(_item_dir(step_dir, item)))
    return jax.tree_util.tree_unflatten(structure, [array for _, array in each_array(step_dir, item)])


def read_tensors(step_dir, item: str) -> dict[str, np.ndarray]:
    return dict(each_array(step_dir, item))


def host_checksums(tensors: dict[str, np.ndarray]) -> dict[str, str]:
    """manager.py's checksum of every host array, as the save recorded it."""
    return {name: host_checksum(array) for name, array in tensors.items()}


def _describe_sharding(sharding) -> str:
    if sharding is None:
        return 'n/a'
    if hasattr(sharding, 'axis_names') and hasattr(sharding, 'partition_spec'):
        mesh = ','.join(f'{name}={int(size)}' for name, size in zip(sharding.axis_names, sharding.shape))
        spec = ', '.join(repr(axis) for axis in sharding.partition_spec)
        return f'mesh({mesh}) P({spec})'
    if hasattr(sharding, 'device_str'):
        return f'single device {sharding.device_str}'
    return type(sharding).__name__


def tensor_layouts(step_dir, item: str) -> dict[str, TensorLayout]:
    """Shape, dtype and saved sharding of every array, from the metadata alone."""
    layouts = {}
    for name, meta in flatten(_metadata_tree(_item_dir(step_dir, item))).items():
        dtype = getattr(meta, 'dtype', None)
        layouts[name] = TensorLayout(
            tuple(int(n) for n in getattr(meta, 'shape', ())),
            np.dtype(dtype).name if dtype is not None else 'n/a',
            _describe_sharding(getattr(meta, 'sharding', None)),
        )
    return layouts


def tensor_stats(array: np.ndarray) -> dict[str, float | None]:
    if array.size == 0:
        return dict.fromkeys(('min', 'max', 'mean', 'std'))
    values = np.asarray(array, np.float64)
    return {
        'min': float(values.min()),
        'max': float(values.max()),
        'mean': float(values.mean()),
        'std': float(values.std()),
    }


# --- what the model config implies -----------------------------------------------------


# Model config fields with a default that older checkpoints' records do not hold (LLaMA-3's
# from Hugging Face config.json).
_ADDED_FIELDS = set(HF_ONLY_FIELDS)


def model_config_object(family: str, model_config: dict):
    """The frozen config dataclass of the family, built from trainer_state's model_config."""
    from jaxtrain.models import FAMILIES  # with flax: slow to import, and only verify/export need it

    if family not in FAMILIES:
        raise CheckpointError(
            f"trainer_state: model_family: expected one of {', '.join(sorted(FAMILIES))}, found {family!r}"
        )
    config_cls = FAMILIES[family][1]
    fields = [f.name for f in dataclasses.fields(config_cls)]
    # Checkpoints written before a field was added lack it; its default is what they trained.
    required = {f.name for f in dataclasses.fields(config_cls) if f.name not in _ADDED_FIELDS}
    if not isinstance(model_config, dict) or not required <= set(model_config) <= set(fields):
        raise CheckpointError(
            f"trainer_state: model_config: expected the fields of {config_cls.__name__} "
            f"({', '.join(fields)}), "
            f'found {model_config!r}'
        )
    try:
        return config_cls(**model_config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f'trainer_state: model_config: {first_line(e)}') from None


def expected_param_layouts(family: str, model_config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} of the parameters the trainer would restore into. nnx.eval_shape
    traces the constructor abstractly: no memory for the weights, no compilation."""
    from flax import nnx

    from jaxtrain.models import FAMILIES  # with flax: slow to import, and only verify/export need it

    config = model_config_object(family, model_config)
    model_cls = FAMILIES[family][0]
    abstract = nnx.eval_shape(lambda: model_cls(config, rngs=nnx.Rngs(0)))
    params = nnx.to_pure_dict(nnx.split(abstract, nnx.Param)[1])
    return {name: (tuple(x.shape), np.dtype(x.dtype).name) for name, x in flatten(params).items()}


# --- verify ----------------------------------------------------------------------------


def _shape_problems(layouts: dict[str, tuple], family: str, model_config: dict, lora=None) -> list[str]:
    """What differs between `layouts` ({name: (shape, dtype name)}) and the model config's."""
    if lora:  # a LoRA checkpoint's params are its adapters (checkpoint/resume_checks.py)
        from jaxtrain.checkpoint.resume_checks import expected_lora_layouts

        expected = expected_lora_layouts(family, model_config_object(family, model_config), lora)
    else:
        expected = expected_param_layouts(family, model_config)
    problems = []
    for name in sorted(set(expected) | set(layouts)):
        if name not in layouts:
            problems.append(f'params/{name}: expected by the model config, not in the checkpoint')
        elif name not in expected:
            problems.append(f'params/{name}: in the checkpoint, not a parameter of the {family} model')
        else:
            found = layouts[name]
            if found != expected[name]:
                problems.append(
                    f'params/{name}: expected shape {expected[name][0]} {expected[name][1]} for the '
                    f'model config, found {found[0]} {found[1]}'
                )
    return problems


def _item_checksums(step_dir, item: str) -> tuple[dict, dict]:
    """({tensor name: checksum}, {tensor name: (shape, dtype)}) of an item, read one group at a time
    (each_array) while a thread sums the arrays already read; at most about two groups are held."""
    found, layouts, pending, waiting_bytes = {}, {}, collections.deque(), 0
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='checksum') as summing:
        for name, array in each_array(step_dir, item):
            layouts[name] = (tuple(array.shape), array.dtype.name)
            pending.append((name, summing.submit(host_checksum, array), array.nbytes))
            waiting_bytes += array.nbytes
            while waiting_bytes > READ_GROUP_BYTES:
                done, future, nbytes = pending.popleft()
                found[done] = future.result()
                waiting_bytes -= nbytes
        found.update((name, future.result()) for name, future, _ in pending)
    return {name: found[name] for name in layouts}, layouts


def _outcome(future):
    """The future's result, or the CheckpointError it raised (a damaged item is a problem to list)."""
    try:
        return future.result()
    except CheckpointError as e:
        return e


def verify(step_dir) -> Verification:
    """Every item present and readable, every checksum equal, params shaped as the model config says."""
    step_dir = Path(step_dir)
    problems, checked = [], []
    if is_temporary(step_dir):
        problems.append(f'{step_dir}: an Orbax temporary directory (the save never finished)')
    try:
        state = read_trainer_state(step_dir)
        checked.append('trainer_state JSON readable')
    except CheckpointError as e:
        problems.append(str(e))
        state = None
    if state is not None and not isinstance(state, dict):
        problems.append(
            f'{step_dir / TRAINER_STATE_FILE}: expected a JSON object, found {type(state).__name__}'
        )
        state = None
    if state is not None:
        digest = digest_problem(state, step_dir)
        problems += [digest] if digest else []
        if not digest:
            checked.append(f'trainer_state fields match their {DIGEST_FIELD}')
        named = step_name_problem(state.get('step'), step_dir)
        problems += [named] if named else []
        fields = field_problems(state, step_dir / TRAINER_STATE_FILE)
        problems += fields
        if not fields:
            checked.append('trainer_state fields of the types and ranges a save writes')
    # With fields of the wrong kind the checks below would misread them: the items are only read.
    compare = state is not None and not fields
    recorded = (state or {}).get('checksums', {})
    present = [item for item in ARRAY_ITEMS if (step_dir / item).is_dir()]
    # The items side by side, each summing one read group while it reads the next.
    with concurrent.futures.ThreadPoolExecutor(max(1, len(present)), thread_name_prefix='verify') as pool:
        summed = {item: pool.submit(_item_checksums, step_dir, item) for item in present}
        summed = {item: _outcome(future) for item, future in summed.items()}
    for item in ARRAY_ITEMS:
        required = item == 'params' or bool((state or {}).get('has_optimizer_state'))
        if item not in summed:
            if required:
                why = ' (trainer_state says has_optimizer_state: true)' if item == 'opt_state' else ''
                problems.append(f'{step_dir / item}: expected the {item} item{why}, found nothing')
            continue
        if isinstance(summed[item], CheckpointError):
            problems.append(str(summed[item]))
            continue
        found, layouts = summed[item]
        if not compare:
            why = 'no trainer state' if state is None else 'its fields are not as a save writes them'
            checked.append(f'{item}: {len(found)} tensors readable (checksums not checked: {why})')
            continue
        if item not in recorded:
            problems.append(
                f'{step_dir / TRAINER_STATE_FILE}: checksums.{item}: expected per-tensor checksums, '
                'found none'
            )
        else:
            mismatches = checksum_mismatches(found, recorded[item], item)
            problems += [f'{step_dir}/{line}' for line in mismatches]  # the tensor's path in the step
            if not mismatches:
                checked.append(f'{item}: {len(found)} tensors, checksums good')
        if item == 'params':
            try:
                shape_problems = _shape_problems(
                    layouts, state.get('model_family'), state.get('model_config'), state.get('lora')
                )
            except CheckpointError as e:
                shape_problems = [str(e)]
            problems += shape_problems
            if not shape_problems:
                checked.append(f"params: shapes fit the {state.get('model_family')} model config")
    return Verification(problems, checked)
