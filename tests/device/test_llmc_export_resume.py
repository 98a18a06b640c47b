"""llm.c resumes our export: `train_gpt2cu -y 1` continues a run folder `ckpt export --format llmc-run`
wrote, on a GPU. Skipped unless LLMC_BIN names a built train_gpt2cu (tests/device/llmc_roundtrip.sh
builds one and runs this; docs/llmc.md has the command).

Our half (no GPU): resume llm.c's own step 10 (tests/fixtures/llmc_run/a), train to step 15, save,
export. It runs here unless LLMC_EXPORT_DIR names a folder made earlier by
`python tests/device/test_llmc_export_resume.py prepare DIR` (for a machine without our dependencies).
llm.c's half: resume that folder for steps 16-20. Checks: its losses against llm.c's own uninterrupted
run (a.log) and ours, within LOSS_TOLERANCE (tests/train/test_llmc_resume.py says how it was found),
and its step-20 loader state byte for byte the one llm.c's own run wrote: the data position went
through our files exactly.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
RUN = TESTS / 'fixtures' / 'llmc_run'
LOSS_TOLERANCE = 0.005  # as tests/train/test_llmc_resume.py
LOADER_BYTES = 8 + 2 * 4 + 8 + 5 * 4 + 2520  # the fixture's loader tail: 2 shards, 5 samples, mt19937
EXPORT_STEP = 15


def step_losses(text: str) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in re.finditer(r'step\s+(\d+)/20 \| loss ([\d.]+)', text)}


def prepare(out_dir) -> Path:
    """Our half: llm.c step 10 -> our steps 11-20 (saves at 15 and 20) -> export step 15 to out_dir."""
    sys.path[:0] = [str(TESTS), str(TESTS / 'train')]
    from test_llmc_resume import llmc_run_config
    from trainer_runs import train

    from jaxtrain.tools import ckpt

    out_dir = Path(out_dir)
    work = out_dir.parent / (out_dir.name + '.work')
    config = llmc_run_config(
        work,
        resume_from=str(RUN / 'a' / 'model_00000010.bin'),
        checkpoint_dir=str(work / 'ck'),
        save_steps=5,
        save_optimizer_state=True,
        dtype='float32',
    )
    code, losses, out = train(config)
    assert code == 0, out[-2000:]
    step_dir = work / 'ck' / f'checkpoint_step_{EXPORT_STEP:06d}'
    assert ckpt.main(['export', str(step_dir), '--format', 'llmc-run', '--output', str(out_dir)]) == 0
    (out_dir / 'ours.json').write_text(json.dumps({str(k): v for k, v in losses.items()}))
    return out_dir


LLMC_BIN = os.environ.get('LLMC_BIN', '')


@pytest.mark.skipif(
    not (LLMC_BIN and Path(LLMC_BIN).is_file()), reason='needs LLMC_BIN: a built train_gpt2cu and a GPU'
)
def test_llmc_resumes_our_export(tmp_path):
    given = os.environ.get('LLMC_EXPORT_DIR')
    exported = Path(given) if given else prepare(tmp_path / 'export')
    run = tmp_path / 'run'
    shutil.copytree(exported, run, ignore=shutil.ignore_patterns('ours.json'))
    ours = {int(k): v for k, v in json.loads((exported / 'ours.json').read_text()).items()}
    command = [
        LLMC_BIN,
        '-i',
        str(RUN / 'data' / 'tiny_train_*.bin'),
        '-j',
        str(RUN / 'data' / 'tiny_val_*.bin'),
        '-e',
        str(RUN / 'model_init_bf16.bin'),
        '-b',
        '4',
        '-t',
        '64',
        '-l',
        '1e-3',
        '-u',
        '5',
        '-v',
        '10',
        '-m',
        '2',
        '-s',
        '1000',
        '-n',
        '5',
        '-x',
        '20',
        '-o',
        str(run),
        '-y',
        '1',
    ]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    log = done.stdout + done.stderr
    figures_dir = os.environ.get('LLMC_ROUNDTRIP_OUT')
    if figures_dir:
        (Path(figures_dir) / 'llmc_resume.log').write_text(log)
    assert done.returncode == 0, log[-3000:]
    theirs = step_losses(log)
    assert sorted(theirs) == list(range(EXPORT_STEP + 1, 21)), log[-3000:]
    reference = step_losses((RUN / 'a.log').read_text())
    gaps = {s: (round(theirs[s] - reference[s], 6), round(theirs[s] - ours[s], 6)) for s in theirs}
    if figures_dir:
        (Path(figures_dir) / 'llmc_resume_figures.json').write_text(
            json.dumps(
                {
                    'llmc_after_our_export': theirs,
                    'llmc_uninterrupted': {s: reference[s] for s in theirs},
                    'ours': {s: ours[s] for s in theirs},
                    'gaps_vs_llmc_and_vs_ours': gaps,
                },
                indent=1,
            )
        )
    print('step: llm.c from our export, minus llm.c uninterrupted, minus ours:', gaps)
    assert all(abs(a) < LOSS_TOLERANCE and abs(b) < LOSS_TOLERANCE for a, b in gaps.values()), gaps
    written = (run / 'state_00000020_00000.bin').read_bytes()
    assert written[-LOADER_BYTES:] == (RUN / 'a' / 'state_00000020_00000.bin').read_bytes()[-LOADER_BYTES:]


if __name__ == '__main__':
    if len(sys.argv) != 3 or sys.argv[1] != 'prepare':
        sys.exit('usage: python tests/device/test_llmc_export_resume.py prepare DIR')
    os.environ.setdefault('JAX_PLATFORMS', 'cpu')
    print(prepare(sys.argv[2]))
