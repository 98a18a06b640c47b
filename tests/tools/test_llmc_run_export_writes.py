"""`ckpt export --format llmc-run` into llm.c run folders: --force replaces only the step files an
earlier export wrote (never train_gpt2cu's own), a failed write leaves the step uncommitted and
says "disk full", and --version 3 writes an fp32 model file.

The step exported is llm.c's own step 10 (tests/fixtures/llmc_run/a) saved as one of our Orbax
checkpoints without training: its master weights as params, its m and v as AdamW's moments. The
state file an export writes is then llm.c's, byte for byte after the header: an expectation that
does not come from our writer.
"""

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
from trainer_runs import llmc_step_as_orbax

from jaxtrain.checkpoint.formats.llmc_run.restore import locate
from jaxtrain.tools import ckpt
from llmc_io import llmc_run
from llmc_io.errors import LLMCFormatError

RUN = Path(__file__).resolve().parents[1] / 'fixtures' / 'llmc_run'
STEP = 10
MODEL, STATE, DONE = f'model_{STEP:08d}.bin', f'state_{STEP:08d}_00000.bin', f'DONE_{STEP:08d}'


@pytest.fixture(scope='module')
def step_dir(tmp_path_factory):
    return llmc_step_as_orbax(tmp_path_factory.mktemp('orbax'), STEP)[0]


def export(capsys, step_dir, output, *flags) -> tuple[int, str]:
    code = ckpt.main(['export', str(step_dir), '--format', 'llmc-run', '--output', str(output), *flags])
    out, err = capsys.readouterr()
    if code:
        assert len(err.strip().splitlines()) == 1, err
    return code, err if code else out


def digests(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_force_never_replaces_the_step_files_train_gpt2cu_wrote(tmp_path, capsys, step_dir):
    theirs = tmp_path / 'theirs'
    shutil.copytree(RUN / 'a', theirs)
    before = digests(theirs)
    code, err = export(capsys, step_dir, theirs)
    assert code == 2 and 'pass --force' in err
    code, err = export(capsys, step_dir, theirs, '--force')
    assert code == 2 and f'{DONE}, {MODEL}, {STATE}, which train_gpt2cu or a run wrote' in err
    assert 'left as they are' in err and digests(theirs) == before
    # Nor into another checkpoint root: its resume would meet llm.c files beside its steps.
    code, err = export(capsys, step_dir, step_dir.parent, '--force')
    assert code == 2 and 'found a checkpoint or a checkpoint root' in err
    assert not list(step_dir.parent.glob('*.bin'))


def test_force_replaces_an_earlier_export_and_version_3_writes_fp32(tmp_path, capsys, step_dir):
    out = tmp_path / 'out'
    code, text = export(capsys, step_dir, out)
    assert code == 0 and 'model version 5 bf16' in text
    llm_c_state = (RUN / 'a' / STATE).read_bytes()
    assert (out / STATE).read_bytes()[1024:] == llm_c_state[1024:]
    assert np.fromfile(out / MODEL, '<i4', count=2).tolist() == [20240326, 5]
    code, text = export(capsys, step_dir, out, '--force', '--version', '3')
    assert code == 0 and 'model version 3 fp32' in text
    # llm.c's header, then the master weights of llm.c's state file as fp32 (docs/formats.md §1: v3 layout).
    header = np.fromfile(out / MODEL, '<i4', count=256)
    assert header[:2].tolist() == [20240326, 3]
    n = (len(llm_c_state) - 1024 - 2520 - 8 - 2 * 4 - 8 - 5 * 4) // 12
    master = np.frombuffer(llm_c_state, '<f4', count=n, offset=1024 + 8 * n)
    np.testing.assert_array_equal(np.fromfile(out / MODEL, '<f4', offset=1024), master)
    assert ckpt.main(['verify', str(out)]) == 0
    capsys.readouterr()
    # A file changed since the export is no longer vouched for.
    with open(out / MODEL, 'r+b') as f:
        f.seek(2000)
        f.write(b'\x00\x00\x80\x3f')
    before = digests(out)
    code, err = export(capsys, step_dir, out, '--force')
    assert code == 2 and f'found {MODEL}, which train_gpt2cu or a run wrote' in err and digests(out) == before


def test_a_full_disk_leaves_the_step_uncommitted_and_says_so(tmp_path, capsys, step_dir, disk_full_for):
    out = tmp_path / 'out'
    shutil.copytree(RUN / 'a', out, ignore=shutil.ignore_patterns(f'*{STEP:08d}*'))
    code, text = export(capsys, step_dir, out)
    assert code == 0 and 'note: -y 1 resumes the newest committed step, 20, not this one' in text
    disk_full_for('state_')
    code, err = export(capsys, step_dir, out, '--force')
    assert code == 2 and f'{out / STATE}: disk full (No space left on device)' in err
    assert f'step {STEP} not written and left uncommitted (no {DONE})' in err and 'requested' not in err
    assert not (out / DONE).exists() and llmc_run.committed_steps(out) == [20]
    assert not [p.name for p in out.iterdir() if p.name.endswith('.tmp')]
    # Neither verify nor a resume takes the step: they name the newest committed one.
    assert ckpt.main(['verify', str(out / MODEL)]) != 0
    assert f'step {STEP} was never completed; the newest committed step is 20' in ''.join(capsys.readouterr())
    assert locate(out) == (out.absolute(), 20)
    with pytest.raises(LLMCFormatError, match='was never completed'):
        llmc_run.read_step(*locate(out / MODEL))
