"""Where a writer of llmc_io (`convert`, `tokenizer`, `shard`) may write, checked before it reads
its inputs or writes anything.

A file that exists is replaced only with --force. Even with --force a writer never writes over
one of its own inputs (the same file under any name: os.path.samefile sees through symlinks and
hard links), never over a file of a committed llm.c checkpoint step (model_%08d.bin,
state_%08d_%05d.bin or DONE_%08d in a folder holding that step's DONE_%08d): train_gpt2cu -y 1 and
--resume_from would take the new file as that step's; never writes a file inside a checkpoint step
directory (ours or InfiniTrain's); and never writes an HF folder's files into a checkpoint, a
checkpoint root or an llm.c run folder.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

from llmc_io.errors import LLMCFormatError

_STEP_DIR = re.compile(r'checkpoint_step_\d+')
_STEP_FILE = re.compile(r'^(?:model_(\d{8})\.bin|state_(\d{8})_\d{5}\.bin|DONE_(\d{8}))$')


def same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing (or unreadable): not the same existing file
        return False


def committed_step_of(path) -> int | None:
    """The step whose committed llm.c checkpoint `path` is a file of, else None."""
    m = _STEP_FILE.match(os.path.basename(path))
    if not m:
        return None
    step = int(next(g for g in m.groups() if g))
    done = os.path.join(os.path.dirname(os.path.abspath(path)), f'DONE_{step:08d}')
    return step if os.path.isfile(done) else None


def step_dir_holding(path) -> str | None:
    """The checkpoint step directory (ours or InfiniTrain's: checkpoint_step_NNNNNN, or one holding
    a trainer state) that `path` lies inside, symlinks resolved; None when it lies in none."""
    folder = os.path.dirname(os.path.realpath(path))
    while True:
        name = os.path.basename(folder)
        marked = any(os.path.exists(os.path.join(folder, m)) for m in ('trainer_state', 'trainer_state.json'))
        if _STEP_DIR.fullmatch(name) or marked:
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def refuse_inputs(path, inputs: Iterable, flag: str) -> None:
    """Never one's own input, --force or not."""
    for given in inputs:
        if same_file(path, given):
            alias = '' if os.fspath(given) == os.fspath(path) else ' (the same file under another name)'
            raise LLMCFormatError(
                path,
                flag,
                'a file other than the input',
                f'the input {os.fspath(given)}{alias}',
                'writing it would destroy what is being read; choose another output',
            )


def check_new_file(path, force: bool, inputs: Iterable = (), flag: str = 'OUT') -> None:
    """`path` is a new file, or (with force) one to replace; never an input or a checkpoint's file."""
    refuse_inputs(path, inputs, flag)
    if os.path.isdir(path):
        raise LLMCFormatError(path, flag, 'a file to write', 'a directory', 'name a file')
    holder = step_dir_holding(path)
    if holder is not None:
        raise LLMCFormatError(
            path,
            flag,
            'a path outside every checkpoint',
            f'a path inside the checkpoint step {holder}',
            'writing there would change that checkpoint; choose another output',
        )
    step = committed_step_of(path)
    if step is not None and os.path.exists(path):
        raise LLMCFormatError(
            path,
            flag,
            'a file that is no checkpoint\'s',
            f'a file of the committed llm.c step {step} (DONE_{step:08d} beside it)',
            'replacing it would change that checkpoint; choose another output',
        )
    if os.path.exists(path) and not force:
        raise LLMCFormatError(
            path, flag, 'a path that does not exist yet', 'a file there', 'pass --force to replace it'
        )


def holds_step_dirs(folder) -> bool:
    """A checkpoint step of ours (Orbax) or InfiniTrain's, or a root of them: files written into one
    would stand beside (or in for) its steps."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    marks = ('trainer_state', 'trainer_state.json', 'rank_000000', 'jaxtrain.lock')
    return any(n in marks or n.startswith('checkpoint_step_') for n in names)


def foreign_hf_files(folder) -> list[str]:
    """The Hugging Face files in `folder` (config, weights, tokenizer) that llmc_io did not write:
    all of them unless its config.json holds `llmc_header`, which save_hf writes beside HF's keys.
    A folder that another program wrote (a model downloaded from the Hub) is thus never replaced."""
    from llmc_io.hf.config import CONFIG_FILE, GENERATION_CONFIG_FILE
    from llmc_io.hf.weights import INDEX_FILE, SHARD_NAME, SINGLE_FILE

    named = (
        CONFIG_FILE,
        GENERATION_CONFIG_FILE,
        SINGLE_FILE,
        INDEX_FILE,
        'tokenizer.json',
        'tokenizer_config.json',
    )
    present = sorted(n for n in os.listdir(folder) if n in named or SHARD_NAME.fullmatch(n))
    try:
        with open(os.path.join(folder, CONFIG_FILE), encoding='utf-8') as f:
            ours = isinstance(json.load(f).get('llmc_header'), dict)
    except (OSError, ValueError, AttributeError):
        ours = False
    return [] if ours else present


def check_new_folder(path, force: bool, inputs: Iterable = (), flag: str = 'OUT') -> None:
    """A folder to create or an empty one, or (with force) one whose files of that name are replaced;
    never an input folder nor a checkpoint's."""
    refuse_inputs(path, inputs, flag)
    if os.path.exists(path) and not os.path.isdir(path):
        raise LLMCFormatError(path, flag, 'a folder to write', 'a file')
    from llmc_io.llmc_run import is_run_dir

    if holds_step_dirs(path) or is_run_dir(path):
        raise LLMCFormatError(
            path,
            flag,
            'a folder for the Hugging Face files',
            'a checkpoint, a checkpoint root or an llm.c run folder',
            '--force never writes into one; choose another output',
        )
    if os.path.isdir(path) and os.listdir(path) and not force:
        names = ', '.join(sorted(os.listdir(path))[:4])
        raise LLMCFormatError(
            path,
            flag,
            'a new or empty folder',
            f'one holding {names}',
            'pass --force to replace the Hugging Face files llmc_io wrote there',
        )
    foreign = foreign_hf_files(path) if os.path.isdir(path) else []
    if foreign:
        raise LLMCFormatError(
            path,
            flag,
            '(with --force) Hugging Face files that llmc_io wrote (config.json with llmc_header)',
            f'{", ".join(foreign[:4])} of another program',
            '--force never replaces those; choose another output',
        )
