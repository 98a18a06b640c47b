"""InfiniTrain checkpoint directories, every generation, read into NumPy parameter trees.

Kinds (what `ckpt ls` prints), after InfiniTensor/InfiniTrain's own code:
  infinitrain       HEAD b24d92f infini_train/src/checkpoint/checkpoint.cc: model.ckpt, [optimizer.ckpt],
                    trainer_state.json (HEAD schema, not valid JSON as upstream writes it)
  infinitrain-bin   PR f9cb65b5 infini_train/src/checkpoint.cc, --checkpoint_format bin: model.bin (an llm.c
                    file, SaveAsLLMC), [optimizer.bin (CKPT, name-keyed Adam)], trainer_state.json (PR schema)
  infinitrain-pth   the same with --checkpoint_format pth: model.pth / optimizer.pth, both CKPT
A multi-rank run writes each rank under `<step dir>/rank_{:06d}`; llmc_io/infinitrain/ranks.py merges
the tensor-, context- and pipeline-parallel shards and checks that data-parallel replicas agree.
No optimizer file is normal: SGD has an empty StateDict and upstream then writes none.

writer.py writes these directories (into a temporary sibling renamed when complete); this module reads
them, names their kind, and prunes a root's old steps.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import shutil
from pathlib import Path

import numpy as np

import llmc_io
from jaxtrain.checkpoint.layout import kept_steps
from jaxtrain.checkpoint.layout import step_of
from llmc_io.infinitrain import names
from llmc_io.infinitrain import ranks as infinitrain_ranks
from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.state import InfiniTrainState, read_trainer_state
from llmc_io.infinitrain.topology import Topology
from llmc_io.infinitrain.statedict import read_state_dict
from llmc_io.tensors import tree_leaves

HEAD_KIND = 'infinitrain'
PR_BIN_KIND = 'infinitrain-bin'
PR_PTH_KIND = 'infinitrain-pth'
KINDS = (HEAD_KIND, PR_BIN_KIND, PR_PTH_KIND)
LRS_FORMAT = 'infinitrain-lrs'  # HEAD's files, LR-scheduler generation (formats/infinitrain/schedule.py)


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generation of InfiniTrain's step directories, as format.py's InfiniTrainFormat takes it."""

    name: str  # the kind `ckpt` names it by, and --checkpoint_format's value where a run saves it
    files: str  # the kind of model and optimizer files it holds (detect_kind's answer)
    saved_by_runs: bool  # a run saves it (--checkpoint_format); else it is read only


GENERATIONS = (
    Generation(HEAD_KIND, HEAD_KIND, saved_by_runs=True),
    Generation(LRS_FORMAT, HEAD_KIND, saved_by_runs=True),  # HEAD's files and lr_scheduler.ckpt
    Generation(PR_BIN_KIND, PR_BIN_KIND, saved_by_runs=True),
    Generation(PR_PTH_KIND, PR_PTH_KIND, saved_by_runs=False),  # PyTorch's files: upstream writes them
)
# kind -> (model file, optimizer file)
FILES = {
    HEAD_KIND: ('model.ckpt', 'optimizer.ckpt'),
    PR_BIN_KIND: ('model.bin', 'optimizer.bin'),
    PR_PTH_KIND: ('model.pth', 'optimizer.pth'),
}
TRAINER_STATE = 'trainer_state.json'
# The key of the jaxtrain record's {file: digest} of the step's files (llmc_io/piece_digest.py).
# Records written before it have LEGACY_FILE_DIGESTS, one sha256 over each whole file: still checked.
FILE_DIGESTS = 'sha256_of_64MiB_pieces'
LEGACY_FILE_DIGESTS = 'sha256'
_RANK_DIR = re.compile(r'^rank_(\d{6})$')
TMP_MARK = '.infinitrain-tmp'


@dataclasses.dataclass
class InfiniTrainCheckpoint:
    path: Path  # the directory the files were read from (rank_000000 for a multi-rank step)
    kind: str
    family: str
    params: dict  # NumPy tree, PARAMS_SPEC layout
    moments: tuple | None  # (mu tree, nu tree, adam t) or None when there is no optimizer file
    state: InfiniTrainState
    ranks: int  # rank directories found (1 without rank_*)
    notices: list
    topology: Topology | None = None  # how a multi-GPU run laid its ranks out
    # {file path: digest (llmc_io/piece_digest.py)} of the files whose digest the read itself took
    # (inspection.py's record checks then need not read them again)
    digests: dict = dataclasses.field(default_factory=dict)


def _model_file_kind(directory: Path) -> str | None:
    # PR's Checkpoint::InferFormat prefers model.pth over model.bin; HEAD only knows model.ckpt.
    for kind in (HEAD_KIND, PR_PTH_KIND, PR_BIN_KIND):
        if (directory / FILES[kind][0]).is_file():
            return kind
    return None


def rank_dirs(step_dir) -> list[Path]:
    """[step_dir] or its rank_NNNNNN subdirectories, checked to be 0..N-1 with none missing."""
    step_dir = Path(step_dir)
    ranks = sorted(
        (int(m.group(1)), p) for p in step_dir.iterdir() if p.is_dir() and (m := _RANK_DIR.match(p.name))
    )
    if not ranks:
        return [step_dir]
    for expected, (index, path) in enumerate(ranks):
        if index != expected:
            raise LLMCFormatError(
                step_dir,
                f'rank_{expected:06d}',
                'a directory (ranks are 0..N-1)',
                'missing',
                'copy the whole step directory of every rank',
            )
    return [path for _, path in ranks]


def detect_kind(step_dir) -> str | None:
    """The InfiniTrain kind of a step directory (looking into rank_000000 if present), or None."""
    step_dir = Path(step_dir)
    if not step_dir.is_dir():
        return None
    try:
        first = rank_dirs(step_dir)[0]
    except LLMCFormatError:
        first = step_dir / 'rank_000000'
    return _model_file_kind(first) if first.is_dir() else None


def _expected_shapes_from_state_dict(path, tensors: dict) -> dict:
    """Our tree shapes for the model a CKPT file holds (Vp = V, as upstream keeps at TP=1)."""
    family = names.family_of(tensors)
    num_layers = names.num_layers_of(tensors)
    table = names.name_to_path(family, num_layers)
    shapes = {}
    for name, (path, layer, transposed) in table.items():
        if name not in tensors:
            raise LLMCFormatError(path, f"tensor '{name}'", 'present', 'missing')
        shape = tuple(tensors[name].shape)
        if transposed:
            shape = shape[:-2] + (shape[-1], shape[-2])
        shapes[path] = shape if layer is None else (num_layers,) + shape
    return shapes


def _fit_vocab(params: dict, expected: dict | None) -> dict:
    """An llm.c tree with Vp = V (SaveAsLLMC) padded with zero rows to the Vp the run expects."""
    if expected is None or 'wte' not in params:
        return params
    wte = params['wte']['embedding']
    want = expected.get('wte/embedding')
    if want and wte.shape[0] < want[0] and wte.shape[1:] == tuple(want[1:]):
        params['wte']['embedding'] = np.concatenate(
            [wte, np.zeros((want[0] - wte.shape[0],) + wte.shape[1:], wte.dtype)]
        )
    return params


def _read_model(
    path: Path, kind: str, expected: dict | None, digest_of: dict, assemble: bool, place
) -> tuple[str, dict]:
    if kind == PR_BIN_KIND:
        header, params = llmc_io.load_model(path)
        family = 'gpt2' if isinstance(header, llmc_io.GPT2Header) else 'llama3'
        params = _fit_vocab(params, expected)
        if expected is not None:
            wanted = 'gpt2' if 'wpe/embedding' in expected else 'llama3'
            if wanted != family:
                raise LLMCFormatError(
                    path, 'model family', wanted, family, 'the checkpoint is for another model'
                )
            leaves = tree_leaves(params)
            for tree_path, shape in expected.items():
                found = leaves.get(tree_path)
                if found is None or tuple(found.shape) != tuple(shape):
                    raise LLMCFormatError(
                        path,
                        f'params[{tree_path}]',
                        f'shape {tuple(shape)} (this run\'s model)',
                        'nothing' if found is None else f'shape {tuple(found.shape)}',
                        'the checkpoint is for another model shape',
                    )
            for tree_path in leaves:
                if tree_path not in expected:
                    raise LLMCFormatError(
                        path,
                        f'params[{tree_path}]',
                        'no such entry in this run\'s model',
                        'an array',
                        'the checkpoint is for another model family',
                    )
        return family, params
    tensors = read_state_dict(path, digest_of, place)
    shapes = expected if expected is not None else _expected_shapes_from_state_dict(path, tensors)
    family = names.family_of(tensors)
    return family, names.state_dict_to_tree(path, tensors, shapes, consume=True, assemble=assemble)


def read_checkpoint(
    step_dir,
    expected_shapes: dict | None = None,
    with_optimizer: bool = True,
    vpp: int | None = None,
    run_pipeline: tuple[int, int] | None = None,
    assemble: bool = True,
    place=None,
) -> InfiniTrainCheckpoint:
    """Read an InfiniTrain step directory. expected_shapes: {tree path: shape} of the model that will use it
    (names and shapes are checked against it), or None to take the shapes from the files. vpp: the run's
    --virtual_pipeline_parallel when its pipeline stages fit several (trainer_state.json has no record);
    run_pipeline: (pipeline_parallel, virtual_pipeline_parallel) of the run that resumes, the hint then.
    assemble=False: a single-rank step's stacked and transposed leaves stay FileLeafs of the files'
    arrays (llmc_io.tensors), for a restore to make on the device. place: read_state_dict's, for a
    single-rank step's state-dict files (a restore puts each array on its device as it is read)."""
    step_dir = Path(step_dir)
    if not step_dir.is_dir():
        raise LLMCFormatError(step_dir, 'directory', 'an InfiniTrain checkpoint directory', 'nothing there')
    ranks = rank_dirs(step_dir)
    kinds = {r: _model_file_kind(r) for r in ranks}
    for r, kind in kinds.items():
        if kind is None:
            raise LLMCFormatError(
                r,
                'model file',
                'model.ckpt, model.bin or model.pth',
                'none of them',
                'not an InfiniTrain checkpoint directory',
            )
        if not (r / TRAINER_STATE).is_file():
            raise LLMCFormatError(
                r / TRAINER_STATE,
                'file',
                'present',
                'missing',
                'every InfiniTrain step directory has one; copy it with the model file',
            )
    first = ranks[0]
    kind = kinds[first]
    if len(ranks) > 1 and kind == HEAD_KIND:
        return _read_ranks(step_dir, ranks, expected_shapes, with_optimizer, vpp, run_pipeline)
    state = read_trainer_state(first / TRAINER_STATE)
    notices = list(state.notices)
    if state.tp_size != 1 or state.pp_size != 1 or state.sp_size != 1:
        raise LLMCFormatError(
            first / TRAINER_STATE,
            'tp_size / sp_size / pp_size',
            '1 (one model replica per rank)',
            f'{state.tp_size} / {state.sp_size} / {state.pp_size}',
            'tensor- or pipeline-parallel shards are read from HEAD (model.ckpt) directories only',
        )
    if len(ranks) > 1:
        notices.append(
            f'{step_dir}: {len(ranks)} rank directories; reading rank_000000 (data-parallel replicas)'
        )
    model_path = first / FILES[kind][0]
    digest_of = {}
    opt_path = first / FILES[kind][1]
    # The two files side by side, each read as one stream while its pieces hash on threads of their own.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='infinitrain-model-file') as other:
        model_read = other.submit(_read_model, model_path, kind, expected_shapes, digest_of, assemble, place)
        opt_tensors, opt_error = None, None
        if with_optimizer and opt_path.is_file():
            try:
                opt_tensors = read_state_dict(opt_path, digest_of, place)
            except LLMCFormatError as e:
                opt_error = e
        family, params = model_read.result()  # a damaged model file is named first, as before
    if opt_error is not None:
        raise opt_error
    moments = None
    if opt_tensors is not None:
        shapes = expected_shapes or {k: v.shape for k, v in tree_leaves(params).items()}
        moments = names.moments_to_trees(opt_path, opt_tensors, shapes, consume=True, assemble=assemble)
        del opt_tensors
    return InfiniTrainCheckpoint(
        first,
        kind,
        family,
        params,
        moments,
        state,
        len(ranks),
        notices,
        digests=digest_of,
    )


def _read_ranks(step_dir, ranks, expected_shapes, with_optimizer, vpp, run_pipeline) -> InfiniTrainCheckpoint:
    """A multi-GPU HEAD run: every rank put back into one model (llmc_io/infinitrain/ranks.py)."""
    merged = infinitrain_ranks.read_step(step_dir, ranks, vpp, run_pipeline)
    model_path = ranks[0] / FILES[HEAD_KIND][0]
    shapes = expected_shapes or _expected_shapes_from_state_dict(model_path, merged.model)
    params = names.state_dict_to_tree(model_path, merged.model, shapes)
    moments = None
    if with_optimizer and merged.optimizer is not None:
        moments = names.moments_to_trees(ranks[0] / FILES[HEAD_KIND][1], merged.optimizer, shapes)
    notices = list(merged.state.notices) + merged.notices
    return InfiniTrainCheckpoint(
        ranks[0],
        HEAD_KIND,
        names.family_of(merged.model),
        params,
        moments,
        merged.state,
        len(ranks),
        notices,
        merged.topology,
    )


def model_shape_from_files(ckpt: InfiniTrainCheckpoint) -> dict | None:
    """The llm.c header fields of a directory upstream wrote, where its files say them: the PR's
    model.bin has a header; a GPT-2 CKPT file's tensors give all but the head count, which HEAD's
    trainer_state.json holds truly (upstream's GPT-2 loader demands the default 12 heads of an llm.c
    file, and a --model run writes its own). None otherwise: LLaMA-3's heads and RoPE settings are
    nowhere in a CKPT file, and HEAD writes its config defaults for an llm.c model."""
    if ckpt.kind == PR_BIN_KIND:
        return dataclasses.asdict(llmc_io.load_model(ckpt.path / FILES[ckpt.kind][0])[0])
    if ckpt.family != 'gpt2' or not ckpt.state.shape:
        return None
    rows, channels = ckpt.params['wte']['embedding'].shape
    return dict(
        max_seq_len=ckpt.params['wpe']['embedding'].shape[0],
        vocab_size=rows,
        padded_vocab_size=rows,
        num_layers=ckpt.params['h']['ln_1']['scale'].shape[0],
        num_heads=int(ckpt.state.shape['n_head']),
        channels=channels,
    )


def gzipped_files(step_dir) -> list[str]:
    """InfiniTrain files a step directory (or its rank_000000) holds gzipped, e.g. model.ckpt.gz."""
    step_dir = Path(step_dir)
    if not step_dir.is_dir():
        return []
    first = step_dir / 'rank_000000' if (step_dir / 'rank_000000').is_dir() else step_dir
    known = {name for files in FILES.values() for name in files} | {TRAINER_STATE}
    return sorted(p.name for p in first.glob('*.gz') if p.name[: -len('.gz')] in known)


def gzipped_kind(step_dir) -> str | None:
    """The kind a step directory would be once its gzipped files are unpacked, or None (not gzipped)."""
    names = {name[: -len('.gz')] for name in gzipped_files(step_dir)}
    return next((kind for kind in (HEAD_KIND, PR_PTH_KIND, PR_BIN_KIND) if FILES[kind][0] in names), None)


def gzipped_notice(step_dir) -> str | None:
    """One line for a step directory whose InfiniTrain files are gzipped (as samples are shipped), with
    the command that unpacks them; None for any other directory."""
    kind = gzipped_kind(step_dir)
    if kind is None:
        return None
    packed = ', '.join(gzipped_files(step_dir))
    found = f"{step_dir}: expected InfiniTrain's {FILES[kind][0]}, found it gzipped ({packed})"
    # gunzip unpacks in place: a read-only step (shared samples: no write bit, even for root) is copied out.
    if not (os.access(step_dir, os.W_OK) and os.stat(step_dir).st_mode & 0o222):
        return (
            f'{found}; the directory is read-only: copy the step elsewhere and gunzip there: '
            f'cp -r {step_dir} DIR && chmod -R u+w DIR && gunzip DIR/*.gz'
        )
    return f'{found}; unpack them first: gunzip {step_dir}/*.gz'


# ---- the data position ------------------------------------------------------------------------------------


def position_from_batch_index(batch_index: int, batches_per_step: int, where='data_batch_idx') -> int:
    """Our window position from InfiniTrain's DataLoader batch index (rank 0's: the next batch it reads).

    One of our windows is `batches_per_step` = accumulation x data-parallel InfiniTrain batches, in the same
    token order (docs/formats.md §3: batch b covers tokens [bBT, (b+1)BT+1); rank r of DDP W reads
    b = kW + r).
    """
    if batch_index % batches_per_step:
        raise LLMCFormatError(
            where,
            'data_batch_idx',
            f'a multiple of {batches_per_step} (InfiniTrain batches per '
            'step of this run: accumulation x data parallel)',
            str(batch_index),
            'resume with the batch_size / total_batch_size the checkpoint was written with',
        )
    return batch_index // batches_per_step


def batch_index_from_position(position: int, batches_per_step: int) -> int:
    return position * batches_per_step


def step_dirs(root) -> list[Path]:
    """The committed InfiniTrain step directories under root, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None and detect_kind(p)]
    return sorted(found, key=step_of)


def step_number(step_dir) -> int:
    return step_of(step_dir)


def prune(root, keep: int, protected_steps=(), keep_every: int = 0) -> list[Path]:
    """Keep the newest `keep` step directories (0 = all), as upstream's max_checkpoint_keep does, plus the
    protected steps and every multiple of keep_every (as our Orbax rotation); leftover temporary
    directories of killed saves go too."""
    root = Path(root)
    removed = []
    for p in root.iterdir() if root.is_dir() else ():
        if p.is_dir() and TMP_MARK in p.name:
            shutil.rmtree(p, ignore_errors=True)
    found = step_dirs(root)
    kept = kept_steps([step_number(p) for p in found], keep, keep_every, protected_steps)
    for p in found:
        if step_number(p) in kept or p.is_symlink():
            continue  # a symbolic link is someone's own: never deleted (layout.linked_steps)
        shutil.rmtree(p)
        removed.append(p)
    return removed
