"""What a jaxtrain-written InfiniTrain step directory records about itself, checked.

jaxtrain adds a "jaxtrain" object to trainer_state.json (infinitrain.write_checkpoint): its
own record (step, data position, rng, configs), the sha256 of every file beside it, and the
record's digest (trainer_state.py) over all of that. Resume and `ckpt verify` both check it
here, as they check an Orbax step's record and checksums: a weight edited in model.ckpt, an
edited global_step or data position, or a renamed directory is refused, not trained from.
A directory InfiniTrain itself wrote has no such object; only its name is checked against
its global_step.
"""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.layout import DAMAGED
from jaxtrain.checkpoint.trainer_state import DIGEST_FIELD, digest_problem, step_name_problem
from jaxtrain.checkpoint.trainer_state import field_problems
from jaxtrain.checkpoint.trainer_state import file_sha256


def recorded_problems(step_dir, files_dir, state, known: dict | None = None) -> tuple[list[str], list[str]]:
    """(problems, what was checked) of one step directory. files_dir: where the model file and
    trainer_state.json are (rank_000000 for a multi-rank step); state: its InfiniTrainState.
    known: {file path: sha256} already taken by the read of these files (steps.read_checkpoint),
    which are then not read again."""
    files_dir = Path(files_dir)
    record_file = files_dir / it.TRAINER_STATE
    problems, checked = [], []
    named = step_name_problem(state.global_step, step_dir, record_file)
    problems += [named.replace('step: expected', 'global_step: expected')] if named else []
    record = state.jaxtrain
    if record is None:
        return problems, checked
    digest = digest_problem(record, step_dir, record_file)
    if digest:
        problems.append(digest.replace(f': {DIGEST_FIELD}:', f': jaxtrain.{DIGEST_FIELD}:', 1))
    else:
        checked.append(f'the jaxtrain record matches its {DIGEST_FIELD}')
    with_rng = record if record.get('rng') is not None else {k: v for k, v in record.items() if k != 'rng'}
    fields = field_problems(with_rng, record_file, only_present=True)
    problems += [line.replace(f'{record_file}: ', f'{record_file}: jaxtrain.', 1) for line in fields]
    for key, upstream in (('step', state.global_step),):
        if key in record and record[key] != upstream:
            problems.append(
                f'{record_file}: global_step: expected {record[key]} (the jaxtrain record\'s {key}), found '
                f'{upstream}: the file was edited; {DAMAGED}'
            )
    problems += _other_rank_records(step_dir, files_dir, record)
    recorded = record.get('sha256')  # none in older rank directories; the digest shows none was removed
    if not isinstance(recorded, dict):
        return problems, checked
    # A multi-rank step names every rank's files from the step directory (rank_000001/model.ckpt).
    paths = {
        name: Path(step_dir) / str(name) if '/' in str(name) else files_dir / str(name) for name in recorded
    }
    # Every file on its own thread (hashlib lets go of the GIL): the optimizer file's hash, not
    # the sum of all of them, is what a 1B step's resume waits for.
    with concurrent.futures.ThreadPoolExecutor(max(1, len(paths)), thread_name_prefix='sha256') as pool:
        hashing = {
            name: pool.submit(_sha256, path, known or {}) for name, path in paths.items() if path.is_file()
        }
        found_of = {name: hashing[name].result() if name in hashing else 'no file' for name in paths}
    for name, expected in recorded.items():
        path, found = paths[name], found_of[name]
        if found != expected:
            problems.append(
                f'{path}: sha256: expected {expected} (recorded by jaxtrain), found {found}: the file was '
                f'changed after it was saved; {DAMAGED}'
            )
    if not any('sha256: expected' in p for p in problems):
        checked.append(f'sha256 of {len(recorded)} files as recorded')
    return problems, checked


def _sha256(path: Path, known: dict) -> str:
    return known.get(os.fspath(path)) or file_sha256(path)


def _other_rank_records(step_dir, files_dir: Path, record: dict) -> list[str]:
    """Every rank of a multi-rank step carries the same jaxtrain record as the first (whose digest,
    step and files are checked): one that differs was edited or comes from another save."""
    from llmc_io.errors import LLMCFormatError
    from llmc_io.infinitrain.state import read_trainer_state

    problems = []
    for rank in it.rank_dirs(step_dir):
        if rank == files_dir:
            continue
        try:
            other = read_trainer_state(rank / it.TRAINER_STATE).jaxtrain
        except (LLMCFormatError, OSError) as e:
            problems.append(str(e))
            continue
        if other != record:
            problems.append(
                f'{rank / it.TRAINER_STATE}: jaxtrain: expected the record of {files_dir / it.TRAINER_STATE} '
                f'(every rank saves the same one), found another: the file was edited or copied from '
                f'another save; {DAMAGED}'
            )
    return problems
