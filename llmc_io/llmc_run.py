"""An llm.c training run folder (train_gpt2cu -o DIR): one checkpoint per step, three kinds of file.

After karpathy/llm.c f1e2ace6 train_gpt2.cu write_checkpoint (and utils.h find_max_step):
  model_%08d.bin          the model (GPT-2 v3 fp32 or v5 bf16), written by rank 0
  state_%08d_%05d.bin     each rank's optimizer and loader state (llmc_state.py)
  DONE_%08d               empty; written last, so a step without it was never completed
`-y 1` resumes the highest step that has a DONE marker.

A step we write (write_step) loses its DONE marker before any of its files changes, so a write that
fails part-way (a full disk) leaves a step that is not committed, never a committed mix of old and
new files. `ckpt export --format llmc-run` also writes jaxtrain_export_%08d.json: the sha256 of the
model and state files it wrote. llm.c ignores it; it is how a later export with --force tells the
files an export wrote (replaceable) from those train_gpt2cu or a run wrote (never replaced), and what
verify checks those files against (changed_since_export).

A step we write also records the identity of the training data it was trained on, beside llm.c's
state, in jaxtrain_data_%08d.json (jaxtrain/checkpoint/resume_checks.py's record; llm.c ignores the file), so
that a resume refuses other data under the same names. A step train_gpt2cu wrote has none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path

import llmc_io
from llmc_io.atomic_file import TEMP_SUFFIX, fsync_directory, write_text_atomically
from llmc_io.errors import LLMCFormatError
from llmc_io.llmc_state import LLMCState, read_state, state_path, write_state

_DONE = re.compile(r'^DONE_(\d{8})$')
_MODEL = re.compile(r'^model_(\d{8})\.bin$')
_STATE = re.compile(r'^state_(\d{8})_(\d{5})\.bin$')
# atomic_output's temporaries of a step's files: NAME.<random>.tmp
_TEMPORARY = re.compile(
    r'^(?:model_(\d{8})\.bin|state_(\d{8})_\d{5}\.bin|DONE_(\d{8})|jaxtrain_export_(\d{8})\.json'
    r'|jaxtrain_data_(\d{8})\.json)'
    r'\.\w+' + re.escape(TEMP_SUFFIX) + '$'
)


@dataclasses.dataclass
class LLMCRunStep:
    run_dir: Path
    step: int
    model_path: Path
    state_path: Path
    header: object  # llmc_io.GPT2Header
    model_version: int
    state: LLMCState
    data: dict | None = None  # the training data's identity, where a step of ours recorded it


def model_path(run_dir, step: int) -> Path:
    return Path(run_dir) / f'model_{step:08d}.bin'


def done_path(run_dir, step: int) -> Path:
    return Path(run_dir) / f'DONE_{step:08d}'


def export_record_path(run_dir, step: int) -> Path:
    return Path(run_dir) / f'jaxtrain_export_{step:08d}.json'


def data_record_path(run_dir, step: int) -> Path:
    return Path(run_dir) / f'jaxtrain_data_{step:08d}.json'


def read_data_record(run_dir, step: int) -> dict | None:
    """The data identity a step of ours recorded (write_step's `data`), or None where there is none."""
    path = data_record_path(run_dir, step)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        data = record['data']
        if not isinstance(data, dict) or record.get('step') != step:
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):
        raise LLMCFormatError(
            path,
            'data record',
            f"JSON {{'step': {step}, 'data': {{...}}}} as a jaxtrain save writes it",
            'something else',
            'it was edited or damaged; delete it to resume without checking the training data',
        ) from None
    return data


def committed_steps(run_dir) -> list[int]:
    """The steps with a DONE marker, oldest first ([] for anything that is not a run folder)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in run_dir.iterdir() if (m := _DONE.match(p.name)))


def is_run_dir(path) -> bool:
    """A folder holding llm.c checkpoint files (committed or not)."""
    path = Path(path)
    return path.is_dir() and any(
        _DONE.match(p.name) or _MODEL.match(p.name) or _STATE.match(p.name) for p in path.iterdir()
    )


def split_model_path(path) -> tuple[Path, int] | None:
    """(run folder, step) for a path naming model_%08d.bin, else None."""
    path = Path(path)
    m = _MODEL.match(path.name)
    return (path.parent, int(m.group(1))) if m else None


def _newest(run_dir) -> str:
    steps = committed_steps(run_dir)
    return f'the newest committed step is {steps[-1]}' if steps else 'no step there is committed'


def check_committed(run_dir, step: int) -> None:
    if not done_path(run_dir, step).is_file():
        raise LLMCFormatError(
            done_path(run_dir, step),
            'DONE marker',
            'present (llm.c writes it once the step is complete)',
            'missing',
            f'step {step} was never completed; {_newest(run_dir)}',
        )


def rank_count(run_dir, step: int) -> int:
    return sum(1 for p in Path(run_dir).iterdir() if (m := _STATE.match(p.name)) and int(m.group(1)) == step)


def read_step(run_dir, step: int, need_master: bool = False) -> LLMCRunStep:
    """Read and check one committed step. need_master: refuse a state written without fp32 master
    weights (-w 0). Nothing is read past the first problem, and nothing is written."""
    run_dir = Path(run_dir)
    check_committed(run_dir, step)
    model = model_path(run_dir, step)
    if not model.is_file():
        raise LLMCFormatError(model, 'model file', 'present', 'missing', 'copy the whole run folder')
    info = llmc_io.model_info(model)
    if info.kind != 'gpt2':
        raise LLMCFormatError(model, 'model kind', 'a GPT-2 file (train_gpt2cu)', info.kind)
    state_file = state_path(run_dir, step)
    ranks = rank_count(run_dir, step)
    if ranks == 0:
        raise LLMCFormatError(
            state_file,
            'state file',
            f'present (train_gpt2cu writes it beside {model.name} before DONE)',
            'missing',
            'it was deleted or not copied; copy the whole run folder, or resume another step',
        )
    if ranks != 1 or not state_file.is_file():
        raise LLMCFormatError(
            state_file,
            f'state files of step {step}',
            '1 (a one-process run: state_%08d_00000.bin)',
            ranks,
            'a multi-process run keeps per-rank loader state; resume it with llm.c',
        )
    state = read_state(state_file, info.header.num_parameters)
    if state.step != step:
        raise LLMCFormatError(
            state_file, 'header[10] step', step, state.step, 'the file was renamed or copied wrongly'
        )
    if need_master and state.master is None:
        raise LLMCFormatError(
            state_file,
            'header[4] use_master_weights',
            '1 (fp32 master weights, as asked for)',
            0,
            'the run was written with -w 0; drop --llmc_require_master_weights to resume from its bf16 model',
        )
    data = read_data_record(run_dir, step)
    return LLMCRunStep(run_dir, step, model, state_file, info.header, info.version, state, data)


def step_files(run_dir, step: int) -> list[Path]:
    """The files of `step` in the folder: its model, every rank's state and its DONE marker."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    patterns = (_MODEL, _STATE, _DONE)
    return sorted(
        p
        for p in run_dir.iterdir()
        if any((m := r.match(p.name)) and int(m.group(1)) == step for r in patterns)
    )


def _sha256(path: Path) -> str:
    with open(path, 'rb') as f:
        return hashlib.file_digest(f, 'sha256').hexdigest()


def not_written_by_export(run_dir, step: int) -> list[str]:
    """The names of the step's files that no export of ours wrote: absent from the step's
    jaxtrain_export record, or changed since (sha256). The DONE marker, empty, counts as the
    export's when the record is there."""
    try:
        recorded = json.loads(export_record_path(run_dir, step).read_text()).get('files', {})
    except (OSError, ValueError, AttributeError):
        recorded = None
    foreign = []
    for path in step_files(run_dir, step):
        if _DONE.match(path.name):
            ours = recorded is not None
        else:
            ours = bool(recorded) and recorded.get(path.name) == _sha256(path)
        if not ours:
            foreign.append(path.name)
    return foreign


def changed_since_export(run_dir, step: int) -> list[tuple[Path, str, str]]:
    """(file, sha256 recorded, sha256 found) for each model or state file of `step` whose bytes are
    not those the step's jaxtrain_export record vouches for; [] without a readable record (a step
    train_gpt2cu or a run wrote has none)."""
    try:
        recorded = json.loads(export_record_path(run_dir, step).read_text()).get('files', {})
    except (OSError, ValueError, AttributeError):
        return []
    changed = []
    for path in step_files(run_dir, step):
        expected = recorded.get(path.name) if isinstance(recorded, dict) else None
        if expected is not None and (found := _sha256(path)) != expected:
            changed.append((path, expected, found))
    return changed


def remove_stale_temporaries(run_dir, step: int | None = None) -> list[str]:
    """Removes the temporaries a killed write of ours left (of `step`, or of every step); returns
    their names. Only the run or export writing into the folder may call this: a live write's
    temporary would go too."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    removed = []
    for path in run_dir.iterdir():
        m = _TEMPORARY.match(path.name)
        if m and (step is None or int(next(g for g in m.groups() if g)) == step):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return sorted(removed)


def write_step(
    run_dir,
    header,
    params,
    state: LLMCState,
    version: int = 5,
    exported_from: str = '',
    data: dict | None = None,
) -> None:
    """Write model, state, then DONE, as write_checkpoint does: a step counts only once complete.
    The step's DONE marker (and export and data records) goes first, durably, so that a write
    failing part-way leaves the step uncommitted. exported_from: an export's source, recorded with
    the sha256 of the files written (export_record_path). data: the training data's identity,
    recorded before DONE (data_record_path)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    step = state.step
    done_path(run_dir, step).unlink(missing_ok=True)
    export_record_path(run_dir, step).unlink(missing_ok=True)
    data_record_path(run_dir, step).unlink(missing_ok=True)
    fsync_directory(run_dir)
    remove_stale_temporaries(run_dir, step)
    llmc_io.save_gpt2(model_path(run_dir, step), header, params, version=version)
    write_state(state_path(run_dir, step), state)
    if exported_from:
        written = (model_path(run_dir, step), state_path(run_dir, step))
        record = {
            'written_by': 'jaxtrain ckpt export --format llmc-run',
            'exported_from': exported_from,
            'step': step,
            'files': {p.name: _sha256(p) for p in written},
        }
        write_text_atomically(export_record_path(run_dir, step), json.dumps(record, indent=2) + '\n')
    if data is not None:
        text = json.dumps({'step': step, 'data': data}, indent=2) + '\n'
        write_text_atomically(data_record_path(run_dir, step), text)
    # Empty, so never half written, and created in place: a temporary named DONE_%08d.*.tmp left
    # by a kill would be a commit marker to train_gpt2cu (utils.h find_max_step takes any name
    # starting "DONE_"). The directory is synced first, so the marker never outlives the renames.
    fsync_directory(run_dir)
    fd = os.open(done_path(run_dir, step), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_directory(run_dir)
