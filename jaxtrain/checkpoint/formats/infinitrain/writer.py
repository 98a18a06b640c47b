"""InfiniTrain step directories written: every generation's files into a temporary directory that is
renamed when complete, one rank directory per rank of a topology, each file's digest recorded.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

import llmc_io
from jaxtrain.checkpoint.trainer_state import with_digest
from llmc_io.infinitrain import names
from llmc_io.infinitrain import rank_writer as infinitrain_rank_writer
from llmc_io.atomic_file import fsync_directory
from llmc_io.piece_digest import bytes_piece_digest, file_piece_digest
from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.state import InfiniTrainState, read_trainer_state, write_trainer_state
from llmc_io.infinitrain.topology import Topology
from llmc_io.infinitrain.statedict import write_state_dict
from llmc_io.tensors import LeafEntry
from jaxtrain.checkpoint.formats.infinitrain.steps import (
    FILE_DIGESTS,
    FILES,
    HEAD_KIND,
    PR_BIN_KIND,
    TRAINER_STATE,
    TMP_MARK,
)


def write_checkpoint(
    final_dir,
    kind: str,
    family: str,
    params: dict,
    header,
    moments,
    state: InfiniTrainState,
    replace: bool = False,
    topology: Topology | None = None,
    extra_files: dict[str, bytes] | None = None,
    plan_fetches=None,
) -> Path:
    """Write one step directory atomically. params: NumPy tree; header: llmc_io GPT2Header / LLaMA3Header of
    model; moments: (mu, nu, t) or None (no optimizer file, as upstream does for SGD). An existing
    final_dir is an error unless `replace` (the caller has checked that it wrote it): a directory
    someone else put there is never deleted. topology: a multi-GPU run's layout to write rank_NNNNNN/
    directories for (HEAD files only). extra_files: more files of the directory (of each rank's) by name
    (lr_scheduler.ckpt), written before the sha256s are taken. plan_fetches(arrays): told, on the
    thread that writes a state-dict file, the file's entry arrays in the order it fetches them,
    before it begins (a background save dispatches their copies ahead: step_aligned_copies.py)."""
    final_dir = Path(final_dir)
    if topology is not None and topology.world > 1 and kind != HEAD_KIND:
        raise LLMCFormatError(
            final_dir,
            '--format',
            f'{HEAD_KIND} for a multi-GPU topology',
            kind,
            'rank directories are written as HEAD (b24d92f) files only',
        )
    if final_dir.exists() and not replace:
        raise LLMCFormatError(
            final_dir,
            'directory',
            'a step directory to create',
            'one already there',
            'it is left as it is; move it away, or choose another directory',
        )
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final_dir.name + TMP_MARK, dir=final_dir.parent))
    old = None
    try:
        if topology is not None and topology.world > 1:
            _write_ranks(tmp, family, params, header, moments, state, topology, extra_files)
        else:
            _write_files(tmp, kind, family, params, header, moments, state, extra_files, plan_fetches)
        os.chmod(tmp, 0o755)
        fsync_directory(tmp)  # the files' names, before the rename makes the step look complete
        if final_dir.exists():  # replace: the old one goes under a temporary name until the new is in place
            old = Path(tempfile.mkdtemp(prefix=final_dir.name + TMP_MARK, dir=final_dir.parent))
            os.replace(final_dir, old)
        os.replace(tmp, final_dir)
        fsync_directory(final_dir.parent)  # the rename itself survives a power loss
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not final_dir.exists():
            os.replace(old, final_dir)
        raise
    if old is not None:
        shutil.rmtree(old)
    return final_dir


def _write_files(
    tmp: Path, kind, family, params, header, moments, state, extra_files=None, plan_fetches=None
) -> None:
    """The files of one step directory, each streamed with its digest (piece_digest.py) taken as it
    is written (not read back; llm.c's model.bin excepted). The model file and the optimizer file
    are written side by side, each on its own thread. Each entry (a layer of a leaf) is fetched (from
    the device, in a background save) as it is written and dropped once written, so the host holds a
    few entries at a time."""
    model_name, opt_name = FILES[kind]
    vocab = header.vocab_size

    def write_planned(path: Path, tensors: dict) -> str:
        if plan_fetches is not None:
            plan_fetches([tensor.array for tensor in tensors.values()])
        return write_state_dict(path, tensors)

    def write_model() -> str:
        if kind == PR_BIN_KIND:
            return _save_llmc(tmp / model_name, family, params, header)
        return write_planned(
            tmp / model_name, names.tree_to_state_dict(family, params, vocab, header.max_seq_len)
        )

    def write_moments() -> str:
        mu, nu, t = moments
        return write_planned(
            tmp / opt_name, names.trees_to_moments(family, mu, nu, t, vocab, kind == HEAD_KIND)
        )

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='infinitrain-model-file') as other:
        model_written = other.submit(write_model)
        files = {opt_name: write_moments()} if moments is not None else {}
        files[model_name] = model_written.result()
    files = {name: files[name] for name in (model_name, opt_name) if name in files}
    for name, payload in (extra_files or {}).items():
        (tmp / name).write_bytes(payload)
        files[name] = bytes_piece_digest(payload)
    if state.jaxtrain is not None:  # lets resume and `ckpt verify` prove these are the files we wrote
        files = dict(sorted(files.items()))
        # The record's digest covers the whole object (step, data position, rng, configs, the files').
        state = dataclasses.replace(state, jaxtrain=with_digest({**state.jaxtrain, FILE_DIGESTS: files}))
    write_trainer_state(tmp / TRAINER_STATE, state)


def _on_host(entries: dict) -> dict:
    return {
        name: dataclasses.replace(entry, array=entry.array.fetch())
        if isinstance(entry.array, LeafEntry)
        else entry
        for name, entry in entries.items()
    }


def _write_ranks(
    tmp: Path, family, params, header, moments, state, topology: Topology, extra_files=None
) -> None:
    # With TP > 1 GPT-2's model vocabulary is the padded one (example/gpt2/checkpoint_loader.cc:81-82).
    vocab = header.padded_vocab_size if family == 'gpt2' and topology.tp > 1 else header.vocab_size
    # The ranks' files are cut from every entry: each is fetched to the host first.
    model = _on_host(names.tree_to_state_dict(family, params, vocab, header.max_seq_len))
    optimizer = None
    if moments is not None:
        mu, nu, t = moments
        optimizer = _on_host(names.trees_to_moments(family, mu, nu, t, vocab, head_keys=False))
    if state.jaxtrain is not None:  # what trainer_state.json cannot say, for reading these files back
        state = dataclasses.replace(
            state,
            jaxtrain=dict(
                state.jaxtrain, virtual_pipeline_parallel=topology.vpp, zero_stage=topology.zero_stage
            ),
        )
    heads = (header.num_heads, getattr(header, 'num_kv_heads', header.num_heads))
    rank_dirs_written = infinitrain_rank_writer.write_step(
        tmp, family, model, optimizer, state, topology, heads
    )
    for rank_dir in rank_dirs_written:  # every rank saves the same scheduler (its own copy)
        for name, payload in (extra_files or {}).items():
            (rank_dir / name).write_bytes(payload)
    if state.jaxtrain is not None:
        _record_rank_digests(tmp, rank_dirs_written)


def _record_rank_digests(step_dir: Path, ranks: list[Path]) -> None:
    """Every rank's trainer_state.json gets the digest of every rank's files, named from the step
    directory (rank_000001/model.ckpt): two ranks' files swapped, or data-parallel replicas edited
    alike (which still agree with each other), are then told from the files we wrote."""
    files = {
        f'{rank.name}/{p.name}': file_piece_digest(p)  # read back: the ranks are written elsewhere
        for rank in ranks
        for p in sorted(rank.iterdir())
        if p.name != TRAINER_STATE
    }
    for rank in ranks:
        rank_state = read_trainer_state(rank / TRAINER_STATE)
        record = with_digest({**rank_state.jaxtrain, FILE_DIGESTS: files})
        write_trainer_state(rank / TRAINER_STATE, dataclasses.replace(rank_state, jaxtrain=record))


def _save_llmc(path: Path, family: str, params: dict, header) -> str:
    """SaveAsLLMC's model.bin; returns its digest (piece_digest.py), read back: llm.c's writer takes
    a whole-file sha256, which llm.c files record elsewhere."""
    if family == 'gpt2':
        # SaveAsLLMC (f9cb65b5) writes header V, and the model's vocab (V at TP=1) in the Vp slot: no padding.
        trimmed = dict(params, wte={'embedding': np.asarray(params['wte']['embedding'])[: header.vocab_size]})
        llmc_io.save_gpt2(path, dataclasses.replace(header, padded_vocab_size=header.vocab_size), trimmed)
    else:
        llmc_io.save_llama3(path, header, params)  # major/minor 1/0, floats bit-cast, as SaveAsLLMC
    return file_piece_digest(path)
