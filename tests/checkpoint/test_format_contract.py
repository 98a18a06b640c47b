"""The contract every registered checkpoint format keeps (jaxtrain/checkpoint/registry.py WRITERS),
run over the registry's own list so a newly registered format is covered or fails here: a step
saved through the format's writer is listed as committed and its record names the step; the
weights every way in reads are the arrays that were saved (bit for bit, or rounded to bf16 as
llm.c's model file documents); a byte flipped in the model's or the optimizer's tensor file is
reported by verify and refused, in one line naming the file, by every way in; `ckpt ls|show` name
the step, and an export to another format reads back equal; the protocol's `ckpt` entries
(find_step, ls, show, diff_view, refuse_as_source), asked directly, name the step and its kind and
read the saved params.

One step, llm.c's own step 10 (tests/fixtures/llmc_run/a) as our Orbax checkpoint written by the
trainer's Checkpointer without training, is exported to each other format with `ckpt export`. The
expected weights are that step's fp32 master weights as read here, never our readers' output.
"""

import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from trainer_runs import llmc_step_as_orbax

from jaxtrain.checkpoint import registry
from jaxtrain.checkpoint.resume import read_weights
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.tools import ckpt
from llmc_io import llmc_run
from llmc_io.llmc_state import flat_to_tree
from llmc_io.tensors import tree_leaves

STEP = 10
STEP_DIR = f'checkpoint_step_{STEP:06d}'
# How each registered format is written: None by the run's Checkpointer, else `ckpt export --format`.
EXPORTED_AS = {
    'orbax': None,
    'infinitrain': 'infinitrain',
    'infinitrain-lrs': 'infinitrain-lrs',
    'infinitrain-bin': 'infinitrain-bin',
    'llmc': 'llmc-run',
}
# The files holding the model's tensors and the optimizer's, relative to the path every way in takes
# (Orbax: the item directories).
TENSOR_FILES = {
    'orbax': ('params', 'opt_state'),
    'infinitrain': ('model.ckpt', 'optimizer.ckpt'),
    'infinitrain-lrs': ('model.ckpt', 'optimizer.ckpt'),
    'infinitrain-bin': ('model.bin', 'optimizer.bin'),
    'llmc': (f'model_{STEP:08d}.bin', f'state_{STEP:08d}_00000.bin'),
}
# Another format each one exports to (none from an llm.c run folder): (--format, flags).
EXPORTS_TO = {
    'orbax': ('llmc', ['--version', '3']),
    'infinitrain': ('infinitrain-bin', []),
    'infinitrain-lrs': ('infinitrain-bin', []),
    'infinitrain-bin': ('infinitrain', []),
}


def test_the_contract_runs_over_the_registry_s_list():
    assert tuple(EXPORTED_AS) == registry.FORMAT_NAMES


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """{format name: the path every way in takes for its step 10}, and the saved fp32 params."""
    root = tmp_path_factory.mktemp('formats')
    # A schedule InfiniTrain can run, for the lr_scheduler.ckpt of --format infinitrain-lrs.
    schedule = {'learning_rate': 3e-4, 'num_iteration': 20, 'lr_schedule': 'constant', 'warmup_steps': 0}
    orbax_step, params = llmc_step_as_orbax(root / 'orbax', STEP, **schedule)
    paths = {}
    for name, export_format in EXPORTED_AS.items():
        if export_format is None:
            paths[name] = orbax_step
            continue
        out = root / name if export_format == 'llmc-run' else root / name / STEP_DIR
        assert ckpt.main(['export', str(orbax_step), '--format', export_format, '--output', str(out)]) == 0
        paths[name] = out
    return paths, tree_leaves(params)


def _root(name, path: Path) -> Path:
    return path if name == 'llmc' else path.parent


@pytest.mark.parametrize('name', registry.FORMAT_NAMES)
def test_a_saved_step_is_committed_and_its_record_names_it(name, saved, capsys):
    path = saved[0][name]
    fmt = registry.for_step_dir(path)
    assert (fmt.title, fmt.owns(path)) == (registry.for_flag(name).title, True)
    assert fmt.committed_steps(_root(name, path)) == [STEP]
    others = {f.title: f for f in registry.WRITERS.values() if f.title != fmt.title}
    assert {title: f.committed_steps(_root(name, path)) for title, f in others.items()} == {
        title: [] for title in others
    }
    assert fmt.read_record(path)['step'] == STEP
    assert registry.verify(path).problems == []
    newest, newest_format = registry.newest_step(_root(name, path))  # --resume_from latest
    assert newest_format.title == fmt.title
    assert newest == (path / f'model_{STEP:08d}.bin' if name == 'llmc' else path)


def _expected(name, source: dict) -> dict:
    """The saved params as the format holds them: llm.c's model file is bf16, rounded to nearest even
    (llmc_io/gpt2.py save_gpt2 version 5), here by ml_dtypes; every other format keeps fp32."""
    if name != 'llmc':
        return source
    return {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in source.items()}


def _assert_bitwise(found: dict, expected: dict):
    assert sorted(found) == sorted(expected)
    for key, want in expected.items():
        got = np.asarray(found[key])
        assert (got.dtype, got.shape) == (want.dtype, want.shape), key
        assert got.tobytes() == want.tobytes(), key


@pytest.mark.parametrize('name', registry.FORMAT_NAMES)
def test_the_weights_every_way_in_reads_are_the_saved_ones(name, saved):
    paths, source = saved
    weights = read_weights(paths[name], 'init_from')
    assert weights.family == 'gpt2'
    _assert_bitwise(tree_leaves(weights.params), _expected(name, source))
    if name == 'llmc':  # what a resume reads: the fp32 master weights in the state file
        run = llmc_run.read_step(paths[name], STEP, need_master=True)
        _assert_bitwise(tree_leaves(flat_to_tree(run.state.master, run.header)), source)


def _tensor_file(name, path: Path, part: int) -> tuple[Path, str]:
    """(the file to damage, how a refusal names it): Orbax's data files are content-addressed, so its
    refusals name the tensor in the item whose checksum no longer matches."""
    tensors = path / TENSOR_FILES[name][part]
    if name != 'orbax':
        return tensors, str(tensors)
    largest = max((p for p in tensors.rglob('*') if p.is_file()), key=lambda p: p.stat().st_size)
    return largest, f'{tensors}/'


@pytest.mark.parametrize('part', [0, 1], ids=['model', 'optimizer'])
@pytest.mark.parametrize('name', registry.FORMAT_NAMES)
def test_a_flipped_byte_in_a_tensor_file_is_refused_by_every_way_in(name, part, saved, tmp_path, capsys):
    source = saved[0][name]
    path = tmp_path / source.relative_to(_root(name, source).parent)
    shutil.copytree(_root(name, source), _root(name, path))
    tensors, named = _tensor_file(name, path, part)
    damaged = bytearray(tensors.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    tensors.write_bytes(bytes(damaged))

    problems = registry.verify(path).problems
    assert problems and problems[0].startswith(named), problems
    refusals = []
    for flag, way_in in (
        ('resume_from', lambda: registry.refuse_damaged(path, 'resume_from')),
        ('init_from', lambda: read_weights(path, 'init_from')),
        ('generate', lambda: read_weights(path, 'generate')),
    ):
        with pytest.raises(CheckpointError) as refused:
            way_in()
        refusals.append((flag, str(refused.value)))
    capsys.readouterr()
    out = tmp_path / 'export' / STEP_DIR
    assert ckpt.main(['export', str(path), '--format', 'infinitrain', '--output', str(out)]) == 2
    refusals.append(('ckpt export', capsys.readouterr().err.strip()))
    assert not out.parent.exists()
    for flag, line in refusals:
        assert '\n' not in line, line
        assert f'{flag}: {named}' in line, line


def _shown_step(name, shown: dict) -> int:
    if name == 'orbax':
        return shown['trainer_state']['step']
    return shown['step'] if name == 'llmc' else shown['global_step']


@pytest.mark.parametrize('name', registry.FORMAT_NAMES)
def test_ckpt_ls_and_show_name_the_step_and_an_export_reads_back_equal(name, saved, tmp_path, capsys):
    import json

    paths, source = saved
    path = paths[name]
    capsys.readouterr()
    assert ckpt.main(['ls', str(_root(name, path)), '--json']) == 0
    listed = json.loads(capsys.readouterr().out)
    rows = listed['steps'] if name == 'llmc' else listed['checkpoints']
    assert [(row['step'], row['kind']) for row in rows] == [(STEP, registry.for_step_dir(path).name)]
    assert listed['latest'] == STEP
    assert ckpt.main(['show', str(path), '--json']) == 0
    assert _shown_step(name, json.loads(capsys.readouterr().out)) == STEP
    if name not in EXPORTS_TO:
        return
    export_format, flags = EXPORTS_TO[name]
    out = tmp_path / ('model.bin' if export_format == 'llmc' else STEP_DIR)
    assert ckpt.main(['export', str(path), '--format', export_format, '--output', str(out), *flags]) == 0
    _assert_bitwise(tree_leaves(read_weights(out, 'init_from').params), source)


# The kind `ckpt` names each registered format's step by: the files on disk, not the flag (the
# LR-scheduler generation writes HEAD's files).
KIND_ON_DISK = {
    'orbax': 'orbax',
    'infinitrain': 'infinitrain',
    'infinitrain-lrs': 'infinitrain',
    'infinitrain-bin': 'infinitrain-bin',
    'llmc': 'llmc',
}


def test_every_registered_format_has_a_kind_on_disk():
    assert tuple(KIND_ON_DISK) == registry.FORMAT_NAMES


@pytest.mark.parametrize('name', registry.FORMAT_NAMES)
def test_the_ckpt_entries_of_the_protocol_name_the_step_and_read_the_saved_weights(name, saved):
    """What `ckpt` asks a format (format.CheckpointFormat: find_step, ls, show, diff_view,
    refuse_as_source), asked directly: the step, its kind and, across formats, the saved params."""
    paths, source = saved
    path = paths[name]
    fmt = registry.for_step_dir(path)
    assert fmt.name == KIND_ON_DISK[name]
    step = fmt.find_step(path)
    assert step == path

    lister, listed = registry.ls(_root(name, path), lambda _: {})
    rows = listed['steps'] if name == 'llmc' else listed['checkpoints']
    assert [(row['step'], row['kind']) for row in rows] == [(STEP, KIND_ON_DISK[name])]
    assert listed['latest'] == STEP
    assert str(STEP) in lister.ls_text(listed)

    shown = fmt.show(step, False)
    assert _shown_step(name, shown) == STEP and 'tensors' not in shown
    assert str(STEP) in fmt.show_text(shown, False)

    if name == 'llmc':  # its model file converts with llmc_io; diff and export say so
        with pytest.raises(CheckpointError, match='python -m llmc_io convert'):
            fmt.refuse_as_source(path, 'ckpt diff')
        return
    assert fmt.refuse_as_source(path, 'ckpt diff') is None
    _record, items = fmt.diff_view(step, common=True)
    params = {k[len('params/') :]: v for k, v in items[''].items() if k.startswith('params/')}
    _assert_bitwise(params, source)
