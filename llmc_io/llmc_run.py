"""An llm.c training run folder (train_gpt2cu -o DIR): one checkpoint per step, three kinds of file.

After karpathy/llm.c f1e2ace6 train_gpt2.cu write_checkpoint (and utils.h find_max_step):
  model_%08d.bin          the model (GPT-2 v3 fp32 or v5 bf16), written by rank 0
  state_%08d_%05d.bin     each rank's optimizer and loader state (llmc_state.py)
  DONE_%08d               empty; written last, so a step without it was never completed
`-y 1` resumes the highest step that has a DONE marker.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import llmc_io
from llmc_io.atomic_file import atomic_output
from llmc_io.errors import LLMCFormatError
from llmc_io.llmc_state import LLMCState, read_state, state_path, write_state

_DONE = re.compile(r'^DONE_(\d{8})$')
_MODEL = re.compile(r'^model_(\d{8})\.bin$')
_STATE = re.compile(r'^state_(\d{8})_(\d{5})\.bin$')


@dataclasses.dataclass
class LLMCRunStep:
    run_dir: Path
    step: int
    model_path: Path
    state_path: Path
    header: object  # llmc_io.GPT2Header
    model_version: int
    state: LLMCState


def model_path(run_dir, step: int) -> Path:
    return Path(run_dir) / f'model_{step:08d}.bin'


def done_path(run_dir, step: int) -> Path:
    return Path(run_dir) / f'DONE_{step:08d}'


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
    return LLMCRunStep(run_dir, step, model, state_file, info.header, info.version, state)


def write_step(run_dir, header, params, state: LLMCState, version: int = 5) -> None:
    """Write model, state, then DONE, as write_checkpoint does: a step counts only once complete."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    llmc_io.save_gpt2(model_path(run_dir, state.step), header, params, version=version)
    write_state(state_path(run_dir, state.step), state)
    with atomic_output(done_path(run_dir, state.step)):
        pass
