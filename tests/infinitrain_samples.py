"""The real InfiniTrain files in ../shared/infinitrain, unpacked once per test session.

Every `.gz` is gunzipped into a temporary copy of the tree (the READMEs list both md5s), so tests see the
files exactly as the C++ binary wrote them. Tests that use this skip only when the folder is absent.
"""

import atexit
import functools
import gzip
import re
import shutil
import tempfile
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parents[1].parent.parent / 'shared' / 'infinitrain'
if not SAMPLES.is_dir():
    SAMPLES = Path('/work/shared/infinitrain')
FOLDERS = ('head-gpt2', 'head-llama3', 'pr-gpt2', 'pr-llama3')

needs_samples = pytest.mark.skipif(not SAMPLES.is_dir(), reason=f'{SAMPLES} absent')


def unpack(dest: Path) -> Path:
    """A copy of the sample tree under dest with every .gz replaced by its contents."""
    for src in SAMPLES.rglob('*'):
        if not src.is_file():
            continue
        rel = src.relative_to(SAMPLES)
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == '.gz':
            with gzip.open(src, 'rb') as f_in, open(out.with_suffix(''), 'wb') as f_out:
                shutil.copyfileobj(f_in, f_out)
        else:
            shutil.copyfile(src, out)
    return dest


@functools.cache
def unpacked() -> Path:
    """One unpacked copy of the sample tree per test process, for tests that only read it (a copy to
    damage goes to the test's own tmp_path): gunzipping the 280 MB again per module costs a second
    of CPU each time."""
    root = Path(tempfile.mkdtemp(prefix='infinitrain-samples-'))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return unpack(root / 'tree')


def listed_md5s(folder: str) -> dict[str, str]:
    """{relative path: md5 of the file as written} from a folder README's file table (gz: after gunzip)."""
    md5s = {}
    for line in (SAMPLES / folder / 'README.md').read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        # File rows are 'path | bytes | md5 [| bytes after gunzip | md5 after gunzip]'.
        if (
            len(cells) < 3
            or not re.fullmatch(r'[\d,]+', cells[1])
            or not re.fullmatch(r'[0-9a-f]{32}', cells[2])
        ):
            continue
        name = cells[0]
        if name.endswith('.gz'):
            if len(cells) >= 5 and re.fullmatch(r'[0-9a-f]{32}', cells[4]):
                md5s[name[:-3]] = cells[4]
        else:
            md5s[name] = cells[2]
    return md5s


def step_dirs(root: Path) -> list[Path]:
    """Every checkpoint directory InfiniTrain wrote under root (checkpoint_step_* and checkpoint_final)."""
    return sorted(p for p in root.rglob('checkpoint_*') if p.is_dir())


def sample_commands(folder: str) -> dict[str, list[str]]:
    """A sample folder's commands.txt: each run by its log name, as arguments after the program name."""
    runs = {}
    for line in (SAMPLES / folder / 'commands.txt').read_text().splitlines():
        words = line.split()
        if '2>' in words:
            runs[words[words.index('2>') + 1]] = words[2 : words.index('2>')]
    return runs


def copy_run_inputs(source: Path, dest: Path) -> None:
    """A sample run's train.bin and model.bin (gunzipped when stored as model.bin.gz) into dest."""
    shutil.copy(source / 'train.bin', dest / 'train.bin')
    if (source / 'model.bin').is_file():
        shutil.copy(source / 'model.bin', dest / 'model.bin')
    else:
        with gzip.open(source / 'model.bin.gz') as packed, open(dest / 'model.bin', 'wb') as out:
            shutil.copyfileobj(packed, out)


def run_keys(real: Path, folder: str) -> dict:
    """The config keys of the flags every sample run was made with (the folder READMEs' commands),
    reading the unpacked copy `real` of the tree."""
    family = 'gpt2' if 'gpt2' in folder else 'llama3'
    return dict(
        llmc_filepath=str(real / folder / 'model.bin'),
        input_bin=str(real / folder / 'train.bin'),
        batch_size=2,
        sequence_length=64,
        total_batch_size=128,
        learning_rate=0.01,
        num_iteration=20,
        optimizer='sgd' if family == 'gpt2' else 'adam',
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
    )


def saved_step_tensors(step: Path) -> tuple[str, dict, dict | None, int]:
    """(family, {name: array}, {name: (m, v)} or None without optimizer.ckpt, adam t) of a real
    single-rank step directory, read with llmc_io's state-dict reader."""
    from llmc_io.infinitrain import layout as infinitrain_layout
    from llmc_io.infinitrain import names as infinitrain_names
    from llmc_io.infinitrain.statedict import read_state_dict

    model = {n: t.array for n, t in read_state_dict(step / 'model.ckpt').items()}
    family = infinitrain_names.family_of(model)
    adam, t = None, 0
    if (step / 'optimizer.ckpt').is_file():
        opt = read_state_dict(step / 'optimizer.ckpt')
        order = infinitrain_layout.parameter_order(family, infinitrain_names.num_layers_of(model))
        adam = {name: (opt[f'adam.m.{i}'].array, opt[f'adam.v.{i}'].array) for i, name in enumerate(order)}
        t = int(opt['adam.t'].array)
    return family, model, adam, t
