"""python -m jaxtrain.ckpt (ls / show / diff / verify / export) on checkpoints of real training runs.

One module fixture trains a tiny GPT-2 (an llm.c file with V=256, L=2, C=32 written here with
llmc_io) twice with the same settings, 4 steps saving at steps 2 and 4; every run here has the
same compiled step, so conftest.py's persistent XLA cache pays its compilation (about 15 s on 2
CPU cores) once. Expectations come from outside the tool: the header the model was written
with, arrays read back through Orbax's StandardCheckpointer, jaxtrain.checkpoint's own idea of
`latest`, and the trainer's loss. A LLaMA-3 checkpoint is written through jaxtrain.checkpoint's
Checkpointer with its params sharded over the 8 fake CPU devices, and read back in a 1-device
subprocess. Most calls go through main() in-process; errors must be one line with exit status 2.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tiny_models import random_params, tiny_header
from trainer_runs import load_config, random_shard, restore_params, train, write_shard

import llmc_io
from jaxtrain.checkpoint.manager import path_name
from jaxtrain.checkpoint.manager import Checkpointer
from jaxtrain.checkpoint.resume import resolve_resume
from jaxtrain.tools import ckpt

REPO = Path(__file__).resolve().parents[2]
TINY_GPT2 = tiny_header('gpt2')
TOKENS_PER_STEP = 4 * 64  # configs/gpt2.py:tiny: batch 4 x sequence 64, no accumulation, 1 device
PERTURBED = ('h/mlp/c_fc/kernel', (1, 3, 5), 0.25)  # tensor, element, added value


def flat(tree) -> dict:
    return {path_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def run_tool(capsys, *argv):
    """(exit status, stdout, stderr) of the tool run in-process."""
    code = ckpt.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv):
    code, out, _ = run_tool(capsys, *argv, '--json')
    return code, json.loads(out)


# --- fixtures --------------------------------------------------------------------------


@dataclasses.dataclass
class Runs:
    work: Path
    model: str  # the tiny llm.c file both runs start from
    shard: str
    a: Path  # checkpoint roots of the two identical runs
    b: Path
    losses: dict  # run A's {step: loss}

    def step(self, root: Path, step: int) -> Path:
        return root / f'checkpoint_step_{step:06d}'


def train_tiny(work: Path, name: str, **overrides) -> dict:
    settings = {
        'num_iteration': 4,
        'save_steps': 2,
        'learning_rate': 1e-3,
        'metrics_dir': str(work / f'{name}_metrics'),
    }
    settings.update(overrides)
    code, losses, _ = train(load_config('gpt2', 'tiny', **settings))
    assert code == 0
    return losses


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp('ckpt_tool')
    model = str(work / 'tiny_gpt2.bin')
    llmc_io.save_gpt2(model, TINY_GPT2, random_params(TINY_GPT2, seed=0))
    shard = random_shard(work / 'train.bin', num_tokens=20 * TOKENS_PER_STEP, vocab=TINY_GPT2.vocab_size)
    common = {'input_bin': shard, 'llmc_filepath': model}
    losses = train_tiny(work, 'a', checkpoint_dir=str(work / 'a'), **common)
    assert sorted(losses) == [1, 2, 3, 4]
    assert train_tiny(work, 'b', checkpoint_dir=str(work / 'b'), **common) == losses
    return Runs(work, model, shard, work / 'a', work / 'b', losses)


@pytest.fixture(scope='module')
def perturbed(runs, tmp_path_factory):
    """A copy of A's step 4 whose params item was re-saved with one element changed, nothing else."""
    step_dir = tmp_path_factory.mktemp('perturbed') / 'checkpoint_step_000004'
    shutil.copytree(runs.step(runs.a, 4), step_dir)
    params = jax.tree.map(np.array, restore_params(step_dir))
    tensor, index, delta = PERTURBED
    *parents, leaf = tensor.split('/')
    node = params
    for key in parents:
        node = node[key]
    before = float(node[leaf][index])
    node[leaf][index] += np.float32(delta)
    after = float(node[leaf][index])
    shutil.rmtree(step_dir / 'params')
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(step_dir / 'params', params)
    checkpointer.wait_until_finished()
    return step_dir, before, after


TINY_LLAMA3 = tiny_header('llama3')


@pytest.fixture(scope='module')
def llama_checkpoint(tmp_path_factory):
    """A LLaMA-3 step written by the trainer's own Checkpointer, params sharded over 8 devices."""
    devices = jax.devices()
    assert len(devices) == 8  # conftest.py
    mesh = jax.sharding.Mesh(np.array(devices), ('data',))
    params = random_params(TINY_LLAMA3, seed=1)
    sharded = jax.tree.map(
        lambda x: jax.device_put(x, NamedSharding(mesh, P('data') if x.shape[0] % 8 == 0 else P())), params
    )
    trainer_state = {
        'step': 7,
        'data_position': 7,
        'epoch': 0,
        'model_family': 'llama3',
        'model_config': dataclasses.asdict(TINY_LLAMA3),
        'training_config': {'optimizer': 'adam', 'save_optimizer_state': False},
        'dtype': 'float32',
        'topology': {'platform': 'cpu', 'device_count': 8, 'process_count': 1, 'mesh': {'data': 8}},
        'has_optimizer_state': False,
        'saved_at': time.time(),
        # The Checkpointer adds the rng words and the checksums (of the sharded arrays).
    }
    root = tmp_path_factory.mktemp('llama')
    checkpointer = Checkpointer(str(root), keep_latest=0, keep_every=0)
    checkpointer.save(7, sharded, None, np.array([0, 7], np.uint32), trainer_state)
    checkpointer.close()
    return root / 'checkpoint_step_000007', params


# --- ls ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_ls_lists_steps_marks_latest_and_uncommitted(runs, tmp_path, capsys):
    root = tmp_path / 'root'
    shutil.copytree(runs.a, root)
    # What a save killed mid-write leaves: Orbax's temporary name (items inside or not).
    shutil.copytree(runs.step(root, 2), root / 'checkpoint_step_000006.orbax-checkpoint-tmp-1716')

    code, listing = run_json(capsys, 'ls', root)
    assert code == 0
    rows = [(c['step'], c['committed'], c['latest']) for c in listing['checkpoints']]
    assert rows == [(2, True, False), (4, True, True), (6, False, False)]
    assert listing['latest'] == 4 == int(resolve_resume('latest', str(root))[0].name.split('_')[-1])
    committed = [c for c in listing['checkpoints'] if c['committed']]
    assert all(c['has_optimizer_state'] and c['written_from'] == 'trainer_state' for c in committed)
    assert all(c['size_bytes'] > 0 for c in committed)
    assert 'uncommitted' in listing['checkpoints'][2]['status']

    code, out, _ = run_tool(capsys, 'ls', root)
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ['2', '4', '6']
    assert lines[2].rstrip().endswith('latest') and 'uncommitted' in lines[3]
    assert 'latest: step 4' in out


# --- show --------------------------------------------------------------------------------


def test_show_trainer_state_and_tensors(runs, capsys):
    step_dir = runs.step(runs.a, 4)
    code, out, _ = run_tool(capsys, 'show', step_dir)
    assert code == 0
    assert any(line.split() == ['step', '4'] for line in out.splitlines())
    assert (
        'gpt2: max_seq_len=64 vocab_size=256 padded_vocab_size=256 num_layers=2 num_heads=2 channels=32'
        in out
    )
    assert 'llmc source' in out and runs.model in out
    # The training config: the keys off their default (config/keys.py), the rest counted; --all lists all.
    from jaxtrain.config.keys import KEYS

    defaults = {key: default for key, default, _ in KEYS}
    recorded = json.loads((Path(step_dir) / 'trainer_state' / 'metadata').read_text())['training_config']
    off_default = {k for k, v in recorded.items() if v != defaults.get(k, object())} | {'model_family'}
    shown = {line.split()[0] for line in out.split('training config')[1].splitlines()[1:] if line.strip()}
    assert shown == off_default and 'save_steps' in shown and 'optimizer' not in shown
    assert f'(the {len(recorded) - len(shown)} keys at their default left out; --all lists them)' in out
    code, out, _ = run_tool(capsys, 'show', step_dir, '--all')
    assert code == 0
    assert {line.split()[0] for line in out.split('training config')[1].splitlines()[1:]} == set(recorded)

    code, shown = run_json(capsys, 'show', step_dir, '--tensors')
    assert code == 0
    state = shown['trainer_state']
    assert (state['step'], state['data_position'], state['epoch']) == (4, 4, 0)
    assert state['model_family'] == 'gpt2' and state['model_config'] == dataclasses.asdict(TINY_GPT2)
    assert state['training_config']['save_steps'] == 2 and state['training_config']['optimizer'] == 'adamw'
    assert state['llmc_file'] == runs.model and 'checksums' not in state

    rows = shown['tensors']
    assert all(r['checksum_status'] == 'ok' for r in rows)
    params = {r['name']: r for r in rows if r['item'] == 'params'}
    assert {name: tuple(r['shape']) for name, r in params.items()} == TINY_GPT2.param_shapes()
    saved = flat(restore_params(step_dir))  # read through Orbax's StandardCheckpointer
    for name, row in params.items():
        assert (row['dtype'], row['sharding']) == ('float32', 'mesh(data=1,fsdp=1,tensor=1) P()')
        assert (row['min'], row['max']) == (float(saved[name].min()), float(saved[name].max()))
        assert row['mean'] == pytest.approx(float(saved[name].mean()), abs=1e-7)
        assert row['std'] == pytest.approx(float(saved[name].std()), rel=1e-5)
    opt_names = {r['name'] for r in rows if r['item'] == 'opt_state'}
    assert {'0/count', '0/mu/wte/embedding', '0/nu/h/attn/c_attn/kernel'} <= opt_names
    assert len(opt_names) == 2 * len(params) + 2  # Adam's mu and nu, its count and the schedule's

    code, out, _ = run_tool(capsys, 'show', step_dir, '--tensors')
    assert code == 0 and f'checksums: {len(rows)} of {len(rows)} ok' in out


# --- diff --------------------------------------------------------------------------------


def test_diff_identical_runs(runs, capsys):
    code, result = run_json(capsys, 'diff', runs.step(runs.a, 4), runs.step(runs.b, 4))
    assert code == 0 and result['identical']
    assert len(result['tensors']) == 50 and all(t['status'] == 'identical' for t in result['tensors'])
    assert all(t['max_abs_diff'] == 0 for t in result['tensors'])
    # Only the run's own paths differ.
    assert {f['field'] for f in result['fields']} == {
        'training_config.checkpoint_dir',
        'training_config.metrics_dir',
    }
    code, out, _ = run_tool(capsys, 'diff', runs.step(runs.a, 4), runs.step(runs.b, 4))
    assert code == 0 and out.rstrip().endswith('identical')


def test_diff_of_different_steps_lists_fields(runs, capsys):
    code, result = run_json(capsys, 'diff', runs.step(runs.a, 2), runs.step(runs.a, 4))
    assert code == 1 and not result['identical']
    fields = {f['field']: (f['a'], f['b']) for f in result['fields']}
    assert fields['step'] == (2, 4) and fields['data_position'] == (2, 4)
    assert all(t['status'] == 'different' for t in result['tensors'])


def test_diff_names_the_perturbed_tensor(runs, perturbed, capsys):
    step_dir, before, after = perturbed
    expected_diff = abs(after - before)
    code, result = run_json(capsys, 'diff', runs.step(runs.a, 4), step_dir)
    assert code == 1 and not result['identical'] and result['fields'] == []
    changed = [t for t in result['tensors'] if t['status'] != 'identical']
    assert [t['name'] for t in changed] == [f'params/{PERTURBED[0]}']
    assert changed[0]['max_abs_diff'] == expected_diff
    assert changed[0]['max_rel_diff'] == pytest.approx(expected_diff / max(abs(before), abs(after)))

    code, out, _ = run_tool(capsys, 'diff', runs.step(runs.a, 4), step_dir)
    assert code == 1
    [line] = [line for line in out.splitlines() if PERTURBED[0] in line]
    assert line.split()[1:] == ['different', f'{expected_diff:.6g}', f"{changed[0]['max_rel_diff']:.6g}"]


def test_diff_lists_tensors_present_on_one_side(runs, tmp_path, capsys):
    without_optimizer = tmp_path / 'checkpoint_step_000004'
    shutil.copytree(runs.step(runs.a, 4), without_optimizer)
    shutil.rmtree(without_optimizer / 'opt_state')
    code, result = run_json(capsys, 'diff', runs.step(runs.a, 4), without_optimizer)
    assert code == 1 and not result['identical']
    statuses = {t['name']: t['status'] for t in result['tensors']}
    assert statuses['opt_state/0/mu/wte/embedding'] == 'only in A'
    assert {s for n, s in statuses.items() if n.startswith('params/')} == {'identical'}


def test_diff_against_a_params_only_checkpoint_summarises_the_optimizer_state(runs, tmp_path, capsys):
    without_optimizer = tmp_path / 'checkpoint_step_000004'
    shutil.copytree(runs.step(runs.a, 4), without_optimizer)
    shutil.rmtree(without_optimizer / 'opt_state')
    _, result = run_json(capsys, 'diff', runs.step(runs.a, 4), without_optimizer)
    count = sum(t['name'].startswith('opt_state/') for t in result['tensors'])
    assert count > 10
    code, out, _ = run_tool(capsys, 'diff', runs.step(runs.a, 4), without_optimizer)
    assert code == 1
    assert not [line for line in out.splitlines() if line.startswith('opt_state/0')]
    [row] = [line for line in out.splitlines() if line.startswith('opt_state/')]
    assert row.split() == [
        'opt_state/',
        f'({count}',
        'tensors)',
        'only',
        'in',
        'A:',
        'B',
        'has',
        'no',
        'opt_state',
    ]


# --- verify ------------------------------------------------------------------------------


def test_verify_good_checkpoint(runs, capsys):
    code, out, _ = run_tool(capsys, 'verify', runs.step(runs.a, 2))
    assert code == 0 and out.startswith('OK:')
    code, result = run_json(capsys, 'verify', runs.step(runs.a, 4))
    assert code == 0 and result['ok'] and result['problems'] == []
    # A root, as --init_from takes one: its newest committed step (runs.a saved steps 2 and 4).
    code, out, _ = run_tool(capsys, 'verify', runs.a)
    first, second = out.splitlines()[:2]
    assert code == 0 and first.endswith('verifying its newest committed step, checkpoint_step_000004')
    assert second.startswith(f"OK: {runs.step(runs.a, 4)} (orbax)")
    code, result = run_json(capsys, 'verify', runs.a)
    assert code == 0 and (result['root'], result['path']) == (str(runs.a), str(runs.step(runs.a, 4)))


def test_verify_names_the_tensor_whose_checksum_fails(perturbed, capsys):
    code, result = run_json(capsys, 'verify', perturbed[0])
    assert code == 1 and not result['ok']
    [problem] = result['problems']
    assert problem.startswith(f'{perturbed[0]}/params/{PERTURBED[0]}: checksum expected ')
    code, out, _ = run_tool(capsys, 'verify', perturbed[0])
    assert code == 1 and out.startswith('FAILED:') and f'params/{PERTURBED[0]}' in out


@pytest.mark.parametrize('item', ['trainer_state', 'params', 'opt_state'])
def test_verify_names_a_missing_item(runs, tmp_path, capsys, item):
    step_dir = tmp_path / 'checkpoint_step_000004'
    shutil.copytree(runs.step(runs.a, 4), step_dir)
    shutil.rmtree(step_dir / item)
    code, result = run_json(capsys, 'verify', step_dir)
    assert code == 1
    assert any(str(step_dir / item) in p for p in result['problems']), result['problems']


def test_verify_checks_shapes_against_the_model_config(runs, tmp_path, capsys):
    step_dir = tmp_path / 'checkpoint_step_000004'
    shutil.copytree(runs.step(runs.a, 4), step_dir)
    state_file = step_dir / 'trainer_state' / 'metadata'
    state = json.loads(state_file.read_text())
    state['model_config']['num_layers'] = 3  # the arrays (and their checksums) still say 2
    state_file.write_text(json.dumps(state))
    code, result = run_json(capsys, 'verify', step_dir)
    assert code == 1
    assert (
        'params/h/attn/c_attn/kernel: expected shape (3, 32, 96) float32 for the model config, found '
        '(2, 32, 96) float32' in result['problems']
    )
    assert not any('checksum' in p for p in result['problems'])


# --- export ------------------------------------------------------------------------------


def test_export_gpt2_is_exact_and_the_trainer_continues_from_it(runs, tmp_path, capsys):
    """The exported file holds exactly the saved params, and the trainer reads it as the same model.

    Run A's step-3 loss is the loss of the params saved at step 2 on data window 2. A run that
    starts from the exported step-2 file on a shard beginning at A's window 2 computes the same
    loss with the same compiled step on the same inputs, so it must print it bit for bit; a
    transposed, reordered or dropped tensor would change it.
    """
    exported = tmp_path / 'step2.bin'
    code, out, _ = run_tool(capsys, 'export', runs.step(runs.a, 2), '--output', exported)
    assert code == 0 and f'--llmc_filepath {exported}' in out
    header, params = llmc_io.load_gpt2(exported)
    assert header == TINY_GPT2
    saved = flat(restore_params(runs.step(runs.a, 2)))
    loaded = flat(params)
    assert sorted(loaded) == sorted(saved)
    for name in saved:
        np.testing.assert_array_equal(loaded[name], saved[name], err_msg=name)

    tokens = np.asarray(llmc_io.read_shard(runs.shard))
    shifted = write_shard(tmp_path / 'from_window2.bin', tokens[2 * TOKENS_PER_STEP :])
    losses = train_tiny(
        tmp_path, 'c', input_bin=shifted, llmc_filepath=str(exported), num_iteration=1, save_steps=0
    )
    assert losses == {1: runs.losses[3]}

    code, _, _ = run_tool(
        capsys, 'export', runs.step(runs.a, 2), '--output', tmp_path / 'bf16.bin', '--version', '5'
    )
    assert code == 0
    _, params_bf16 = llmc_io.load_gpt2(tmp_path / 'bf16.bin')
    for name, array in flat(params_bf16).items():
        np.testing.assert_allclose(array, saved[name], rtol=2**-8, atol=1e-30, err_msg=name)


@pytest.mark.slow
def test_llama_checkpoint_saved_on_8_devices(llama_checkpoint, tmp_path, capsys):
    step_dir, params = llama_checkpoint
    code, result = run_json(capsys, 'verify', step_dir)
    assert code == 0, result['problems']

    code, shown = run_json(capsys, 'show', step_dir, '--tensors')
    shardings = {r['name']: r['sharding'] for r in shown['tensors']}
    assert shardings['wte/embedding'] == "mesh(data=8) P('data')"
    assert shardings['h/attn/c_attn/kernel'] == 'mesh(data=8) P()'

    exported = tmp_path / 'llama.bin'
    code, _, _ = run_tool(capsys, 'export', step_dir, '--output', exported)
    assert code == 0
    header, loaded = llmc_io.load_llama3(exported)
    assert header == TINY_LLAMA3
    for name, array in flat(params).items():
        np.testing.assert_array_equal(flat(loaded)[name], array, err_msg=name)

    code, out, err = run_tool(capsys, 'export', step_dir, '--output', tmp_path / 'v5.bin', '--version', '5')
    assert code == 2 and out == '' and len(err.splitlines()) == 1
    assert 'expected 3 for LLaMA-3' in err and not (tmp_path / 'v5.bin').exists()


@pytest.mark.slow
def test_a_one_device_process_reads_the_8_device_checkpoint(llama_checkpoint):
    """As a user runs it: a fresh interpreter, no JAX_PLATFORMS or fake devices (cpu by default)."""
    env = {k: v for k, v in os.environ.items() if k not in ('JAX_PLATFORMS', 'XLA_FLAGS')}
    env['PYTHONPATH'] = str(REPO)
    done = subprocess.run(
        [sys.executable, '-m', 'jaxtrain.ckpt', 'verify', str(llama_checkpoint[0]), '--json'],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)['ok']


# --- errors ------------------------------------------------------------------------------


def _damaged(runs, tmp_path):
    step_dir = tmp_path / 'checkpoint_step_000004'
    shutil.copytree(runs.step(runs.a, 4), step_dir)
    (step_dir / 'params' / '_METADATA').unlink()
    return step_dir


def _unfinished(runs, tmp_path):
    step_dir = tmp_path / 'checkpoint_step_000008.orbax-checkpoint-tmp-99'
    shutil.copytree(runs.step(runs.a, 4), step_dir)
    return step_dir


ERRORS = {
    'nothing there': (lambda r, t: ['show', t / 'missing'], 'found nothing there'),
    'root for a step': (
        lambda r, t: ['show', r.a],
        'found a checkpoint root holding checkpoint_step_000002, checkpoint_step_000004',
    ),
    'root in diff': (lambda r, t: ['diff', r.step(r.a, 4), r.b], 'found a checkpoint root holding'),
    'not a checkpoint': (lambda r, t: ['verify', t], 'found a directory that is not a checkpoint'),
    'ls nothing there': (lambda r, t: ['ls', t / 'missing'], 'found nothing there'),
    'ls a step': (lambda r, t: ['ls', r.step(r.a, 2)], 'found a step directory'),
    'ls not a root': (lambda r, t: ['ls', t], 'found none'),
    'damaged params': (lambda r, t: ['show', _damaged(r, t), '--tensors'], '_METADATA'),
    'unfinished save': (lambda r, t: ['export', _unfinished(r, t), '--output', t / 'x.bin'], 'temporary'),
    'no output dir': (
        lambda r, t: ['export', r.step(r.a, 4), '--output', t / 'no' / 'x.bin'],
        'existing directory',
    ),
    'usage': (lambda r, t: ['verify'], 'required: STEP_DIR'),
}


@pytest.mark.parametrize('case', ERRORS)
def test_errors_are_one_line_with_exit_status_2(runs, tmp_path, capsys, case):
    argv, expected = ERRORS[case]
    argv = argv(runs, tmp_path)
    try:
        code = ckpt.main([str(a) for a in argv])
    except SystemExit as e:  # argparse usage errors
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ''
    assert len(err.splitlines()) == 1 and expected in err, err


def test_verbose_adds_the_traceback(tmp_path, capsys):
    code, _, err = run_tool(capsys, 'show', tmp_path / 'missing', '--verbose')
    assert code == 2 and 'Traceback' in err and err.rstrip().splitlines()[-1].endswith('found nothing there')


@pytest.mark.parametrize('command', ['ls', 'show', 'diff', 'verify', 'export'])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ckpt.main([command, '--help'])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert '--json' in out
    assert max(len(line) for line in out.splitlines()) <= 110, out


def test_long_field_lists_are_grouped_counted_and_wrapped():
    from jaxtrain.tools.ckpt_commands import field_list_lines

    names = ['step', 'data_position', *(f'training_config.key_{i:02d}_with_a_long_name' for i in range(30))]
    lines = field_list_lines([*names, 'model_config.channels'])
    assert max(map(len, lines)) <= 100 and all(line.startswith('  ') for line in lines)
    text = ' '.join(' '.join(lines).split())
    assert text.startswith('step, data_position training_config: 30 fields: key_00_with_a_long_name, ')
    assert 'key_11_with_a_long_name, and 18 more (--json lists them)' in text and 'key_12' not in text
    assert text.endswith('model_config: channels')


def test_the_tools_help_is_wrapped_prose():
    """The description paragraphs fit a terminal and hold no run of spaces (a backslash that ended a
    docstring line once joined two usage lines with the next line's indentation)."""
    description = ckpt.build_parser().format_help().split('positional arguments')[0]
    for line in description.splitlines():
        assert len(line) <= 110 and not re.search(r'\S {3,}\S', line), line
