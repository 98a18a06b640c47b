"""The checkpoint-format seam (checkpoint/format.py, registry.py): every format and every run
checkpointer carries the whole declared interface, the registry maps flags and the real
binary's step directories to the right format, and both formats refuse later steps alike."""

import json
import shutil

import pytest
from infinitrain_samples import SAMPLES, needs_samples

from jaxtrain.checkpoint import format as ckpt_format
from jaxtrain.checkpoint import layout, registry
from jaxtrain.checkpoint.formats.infinitrain.saver import InfiniTrainCheckpointer
from jaxtrain.checkpoint.manager import Checkpointer


def _declared(protocol) -> set[str]:
    """The members a Protocol declares: its methods and its annotated attributes."""
    methods = {n for n, v in vars(protocol).items() if callable(v) and not n.startswith('_')}
    return methods | set(protocol.__annotations__)


def test_the_protocols_declare_what_the_run_uses():
    assert _declared(ckpt_format.CheckpointFormat) >= {
        'name',
        'title',
        'owns',
        'committed_steps',
        'step_path',
        'open',
        'read_record',
        'verify',
        'read_weights',
        'restore_into',
        'find_step',
        'ls_rows',
        'ls',
        'ls_text',
        'show',
        'show_text',
        'diff_view',
        'refuse_as_source',
    }
    assert _declared(ckpt_format.RunCheckpointer) >= {
        'root',
        'set_aside',
        'step_dir',
        'refuse_later_steps',
        'save',
        'wait',
        'close',
        'abort_notice',
    }


@pytest.mark.parametrize('name', registry.FORMAT_NAMES)
def test_every_format_implements_the_whole_interface(name):
    fmt = registry.for_flag(name)
    assert fmt.name == name
    missing = [m for m in _declared(ckpt_format.CheckpointFormat) if not hasattr(fmt, m)]
    assert missing == []


@pytest.mark.parametrize('cls', [Checkpointer, InfiniTrainCheckpointer])
def test_every_run_checkpointer_implements_the_whole_interface(cls):
    attributes = set(ckpt_format.RunCheckpointer.__annotations__)  # set in __init__
    methods = _declared(ckpt_format.RunCheckpointer) - attributes
    assert [m for m in sorted(methods) if not callable(getattr(cls, m, None))] == []


def test_the_flag_values_are_the_registry_s():
    from jaxtrain.checks.config_checks import CHOICES

    assert {'orbax', 'infinitrain', 'infinitrain-bin'} <= set(registry.FORMAT_NAMES)
    assert CHOICES['checkpoint_format'] == registry.FORMAT_NAMES


@needs_samples
@pytest.mark.parametrize('folder, kind', [('head-gpt2', 'infinitrain'), ('pr-gpt2', 'infinitrain-bin')])
def test_a_step_directory_of_the_real_binary_picks_its_kind(folder, kind):
    step_dir = SAMPLES / folder / 'a' / 'checkpoint_step_000010'
    fmt = registry.for_step_dir(step_dir)
    assert (fmt.name, fmt.title, fmt.owns(step_dir)) == (kind, 'InfiniTrain', True)
    assert fmt.committed_steps(step_dir.parent) == [10, 20]  # checkpoint_final is not a step
    assert registry.ORBAX.committed_steps(step_dir.parent) == []


@needs_samples
def test_the_record_of_an_infinitrain_step_carries_its_best_loss():
    step_dir = SAMPLES / 'pr-gpt2' / 'a' / 'checkpoint_step_000010'
    written = json.loads((step_dir / 'trainer_state.json').read_text())
    record = registry.for_step_dir(step_dir).read_record(step_dir)
    assert (record['step'], record['best_loss']) == (written['global_step'], written['best_loss'])


def test_an_orbax_step_directory_is_ours(tmp_path):
    step_dir = tmp_path / 'checkpoint_step_000003'
    (step_dir / layout.TRAINER_STATE_FILE).parent.mkdir(parents=True)
    (step_dir / layout.TRAINER_STATE_FILE).write_text('{"step": 3}')
    assert registry.for_step_dir(step_dir) is registry.ORBAX
    assert registry.ORBAX.owns(step_dir) and registry.ORBAX.committed_steps(tmp_path) == [3]
    assert registry.ORBAX.read_record(step_dir) == {'step': 3}


@needs_samples
def test_both_formats_refuse_later_steps_in_the_same_words(tmp_path):
    """The refusal is layout.later_steps for both; InfiniTrain's checkpointer then deletes them."""
    root = tmp_path / 'it'
    for step in (10, 20):
        name = f'checkpoint_step_{step:06d}'
        shutil.copytree(SAMPLES / 'pr-gpt2' / 'a' / name, root / name)
    saver = InfiniTrainCheckpointer(
        str(root), 'infinitrain-bin', None, family='gpt2', keep_latest=0, keep_every=0
    )
    with pytest.raises(layout.CheckpointError) as refused:
        saver.refuse_later_steps(5, overwrite=False)
    expected = (
        f'checkpoint_dir: {root}: expected no checkpoints after step 5, found checkpoint_step_000010, '
        'checkpoint_step_000020. To continue from step 5 here, pass --config.overwrite_later_checkpoints=true'
    )
    assert str(refused.value).startswith(expected)
    assert saver.refuse_later_steps(10, overwrite=True) == [20]
    assert sorted(p.name for p in root.iterdir()) == ['checkpoint_step_000010']


def test_no_format_module_imports_resume_or_the_registry():
    import ast
    from pathlib import Path

    folder = Path(registry.__file__).parent / 'formats'
    offenders = []
    for path in sorted(folder.glob('*.py')):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f'{node.module}.{a.name}' for a in node.names]
            hits = [n for n in names if n in ('jaxtrain.checkpoint.resume', 'jaxtrain.checkpoint.registry')]
            offenders += [f'{path.name}: {n}' for n in hits]
    assert offenders == []
