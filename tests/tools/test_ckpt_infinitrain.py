"""python -m jaxtrain.ckpt on InfiniTrain directories: every real sample listed, shown, verified and diffed
across generations; and our own Orbax vs InfiniTrain checkpoints of one run state diff as identical.

Independent expectations: the sample READMEs (steps, kinds, HEAD and PR files holding the same numbers), and
two separate training runs with the same settings, one saving Orbax and one --checkpoint_format infinitrain.
"""

import itertools
import json
import re
import shutil
from pathlib import Path

import pytest

from infinitrain_samples import SAMPLES, needs_samples, step_dirs, unpacked
from jaxtrain.tools import ckpt
from trainer_runs import load_config, random_shard, tiny_llmc_model, train

KIND = {'head': 'infinitrain', 'pr': 'infinitrain-bin', 'lrs': 'infinitrain'}


def run_tool(capsys, *argv):
    code = ckpt.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope='module')
def real():
    if not SAMPLES.is_dir():
        pytest.skip(f'{SAMPLES} absent')
    return unpacked()  # read only: a test damages its own copy


@needs_samples
def test_every_sample_is_listed_shown_and_verified(real, capsys):
    roots = sorted({d.parent for d in step_dirs(real)})
    assert len(roots) == 16  # a/ b/ of every folder, head-llama3 c/, pr-gpt2 p/, lrs-gpt2 l/ n/
    for root in roots:
        code, out, err = run_tool(capsys, 'ls', root, '--json')
        assert code == 0, err
        listed = json.loads(out)['checkpoints']
        expected_kind = 'infinitrain-pth' if root.name == 'p' else KIND[root.parent.name.split('-')[0]]
        assert {e['kind'] for e in listed} == {expected_kind}
        assert sorted(Path(e['path']).name for e in listed) == sorted(p.name for p in root.iterdir())
    for d in step_dirs(real):
        code, out, err = run_tool(capsys, 'show', d, '--json', '--tensors')
        assert code == 0, err
        shown = json.loads(out)
        assert shown['global_step'] == (20 if d.name == 'checkpoint_final' else int(d.name[-6:]))
        assert shown['family'] == ('gpt2' if 'gpt2' in str(d) else 'llama3')
        names = {t['name'] for t in shown['tensors']}
        assert ('adam.t' in names) == ('llama3' in str(d))
        code, out, err = run_tool(capsys, 'verify', d)
        assert code == 0 and out.startswith('OK: '), out + err


@needs_samples
def test_lr_scheduler_generation_shows_its_scheduler_file(real, tmp_path, capsys):
    """PR 151's directories: no last_lr in trainer_state.json; show prints lr_scheduler.ckpt's entries and the
    next step's lr (b.log's step-11 lr, 7.52e-02), verify checks the file against the step."""
    d = real / 'lrs-gpt2/a/checkpoint_step_000010'
    code, out, err = run_tool(capsys, 'show', d, '--json')
    assert code == 0, err
    shown = json.loads(out)
    assert shown['generation'] == 'lrs' and 'last_lr' not in shown
    assert len(shown['lr_scheduler']) == 9 and shown['lr_scheduler']['last_step'] == '10 (int64)'
    assert f"{shown['next_lr']:.2e}" == '7.52e-02'
    code, out, _ = run_tool(capsys, 'show', real / 'lrs-gpt2/n/checkpoint_step_000010')
    assert code == 0 and 'no lr_scheduler.ckpt (style none' in out
    code, out, _ = run_tool(capsys, 'verify', d)
    assert code == 0 and 'lr_scheduler.ckpt: 9 entries, last_step 10' in out
    import shutil

    moved = tmp_path / 'lrs_wrong_step' / 'checkpoint_step_000020'
    shutil.copytree(d, moved)
    shutil.copy(real / 'lrs-gpt2/a/checkpoint_step_000020/lr_scheduler.ckpt', moved / 'lr_scheduler.ckpt')
    code, out, err = run_tool(capsys, 'verify', moved)
    expected = 'lr_scheduler.ckpt: last_step: expected global_step 10 (trainer_state.json), found 20'
    assert code != 0 and expected in out + err
    (moved / 'lr_scheduler.ckpt').write_bytes(b'CKPT' + bytes(8))
    code, out, err = run_tool(capsys, 'verify', moved)
    assert code != 0 and 'magic: expected 0x53524C53' in out + err


@needs_samples
@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
def test_head_and_pr_generations_diff_identical(real, capsys, family):
    for step in ('000010', '000020'):
        code, out, _ = run_tool(
            capsys,
            'diff',
            real / f'head-{family}/a/checkpoint_step_{step}',
            real / f'pr-{family}/a/checkpoint_step_{step}',
        )
        assert code == 0 and out.rstrip().endswith('identical') and '(infinitrain-bin)' in out, out
    code, out, _ = run_tool(
        capsys,
        'diff',
        real / f'head-{family}/a/checkpoint_step_000010',
        real / f'head-{family}/a/checkpoint_step_000020',
    )
    assert code == 1 and 'different' in out


@needs_samples
def test_damaged_sample_is_one_line(real, tmp_path, capsys):
    import shutil

    d = tmp_path / 'checkpoint_step_000010'
    shutil.copytree(real / 'head-gpt2/a/checkpoint_step_000010', d)
    data = (d / 'model.ckpt').read_bytes()
    (d / 'model.ckpt').write_bytes(data[:-10])
    code, out, err = run_tool(capsys, 'verify', d)
    assert code == 1 and "tensor 'transformer.h.1.attn.c_attn.weight' data: expected" in out
    code, out, err = run_tool(capsys, 'show', d)
    assert code == 2 and len(err.strip().splitlines()) == 1 and 'model.ckpt' in err


@pytest.mark.slow  # two trainings
def test_orbax_and_infinitrain_checkpoints_of_one_state_diff_identical(tmp_path, capsys):
    files = dict(
        input_bin=random_shard(tmp_path / 'train.bin'), llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin')
    )
    # The config's AdamW at its learning rate: the step tests/checkpoint/test_infinitrain_resume_verified.py
    # and tests/config/test_infinitrain_flags.py compile for the same model.
    common = dict(num_iteration=2, save_steps=2, **files)
    roots = {}
    for fmt in ('orbax', 'infinitrain'):
        roots[fmt] = tmp_path / fmt
        config = load_config(
            'gpt2',
            checkpoint_dir=str(roots[fmt]),
            metrics_dir=str(tmp_path / f'm_{fmt}'),
            checkpoint_format=fmt,
            **common,
        )
        code, losses, out = train(config)
        assert code == 0, out
    orbax_step, it_step = (
        roots['orbax'] / 'checkpoint_step_000002',
        roots['infinitrain'] / 'checkpoint_step_000002',
    )
    code, out, _ = run_tool(capsys, 'diff', orbax_step, it_step)
    assert code == 0 and out.rstrip().endswith('identical') and '(orbax)' in out and '(infinitrain)' in out, (
        out
    )
    assert 'adam.m/wte/embedding' not in out  # nothing listed as changed
    code, out, _ = run_tool(capsys, 'ls', roots['infinitrain'])
    assert (
        code == 0 and 'infinitrain' in out and f"{losses[2]:.6f}" in out
    )  # the loss is stored and listed as the step line prints it
    # export across kinds: Orbax -> PR generation, which diffs identical to both.
    pr_step = tmp_path / 'pr' / 'checkpoint_step_000002'
    code, out, err = run_tool(
        capsys, 'export', orbax_step, '--format', 'infinitrain-bin', '--output', pr_step
    )
    assert code == 0, err
    assert sorted(p.name for p in pr_step.iterdir()) == ['model.bin', 'optimizer.bin', 'trainer_state.json']
    for other in (orbax_step, it_step):
        code, out, _ = run_tool(capsys, 'diff', pr_step, other)
        assert code == 0 and out.rstrip().endswith('identical'), out
    code, out, _ = run_tool(capsys, 'verify', pr_step)
    assert code == 0 and 'sha256_of_64MiB_pieces of 2 files' in out
    (pr_step / 'optimizer.bin').write_bytes((pr_step / 'optimizer.bin').read_bytes()[:-4] + b'\0\0\0\1')
    code, out, _ = run_tool(capsys, 'verify', pr_step)
    assert code == 1 and 'optimizer.bin: sha256_of_64MiB_pieces: expected' in out
    # Orbax -> master's generation: the scheduler file joins the model and AdamW's state, all verified.
    lrs_step = tmp_path / 'lrs' / 'checkpoint_step_000002'
    code, out, err = run_tool(
        capsys, 'export', orbax_step, '--format', 'infinitrain-lrs', '--output', lrs_step
    )
    assert code == 0, err
    written = ['lr_scheduler.ckpt', 'model.ckpt', 'optimizer.ckpt', 'trainer_state.json']
    assert sorted(p.name for p in lrs_step.iterdir()) == written
    code, out, _ = run_tool(capsys, 'verify', lrs_step)
    assert code == 0 and 'sha256_of_64MiB_pieces of 3 files' in out, out
    scheduler = bytearray((lrs_step / 'lr_scheduler.ckpt').read_bytes())
    scheduler[-1] ^= 1  # one bit of the last entry's value
    (lrs_step / 'lr_scheduler.ckpt').write_bytes(scheduler)
    code, out, _ = run_tool(capsys, 'verify', lrs_step)
    assert code == 1 and 'lr_scheduler.ckpt: sha256_of_64MiB_pieces: expected' in out, out


@needs_samples
@pytest.mark.parametrize('root', ['pr-gpt2/a', 'pr-gpt2/p', 'pr-llama3/a', 'pr-llama3/b'])
def test_ls_table_of_a_pr_root_shows_its_best_loss(real, capsys, root):
    """The PR generation keeps no step loss, only the running minimum `best_loss`: the table prints it
    marked 'best', as the step line formats a loss, read here straight from each trainer_state.json."""
    code, out, err = run_tool(capsys, 'ls', real / root)
    assert code == 0, err
    rows = {line.split()[1]: line for line in out.splitlines()[1:] if line.startswith(('1', '2'))}
    assert rows, out
    for name, line in rows.items():
        best = json.loads((real / root / name / 'trainer_state.json').read_text())['best_loss']
        assert f'best {best:.6f}' in line, line
    code, out, _ = run_tool(capsys, 'ls', real / root, '--json')
    listed = json.loads(out)['checkpoints']
    assert all(e['loss'] is None and isinstance(e['best_loss'], float) for e in listed)


@needs_samples
def test_infinitrain_s_own_checkpoint_against_ours_of_the_same_tensors_is_identical(real, tmp_path, capsys):
    """InfiniTrain's trainer_state.json keeps no model config (HEAD's shape fields are its defaults,
    not the file's), so the fields only ours records are listed as not compared, not as a difference."""
    import dataclasses

    import llmc_io
    from jaxtrain.checkpoint.formats.infinitrain import inspection as ckpt_infinitrain
    from trainer_runs import write_checkpoint

    theirs = real / 'head-gpt2/a/checkpoint_step_000010'
    header, _ = llmc_io.load_model(str(real / 'head-gpt2/model.bin'))
    ours = write_checkpoint(tmp_path / 'ours', 10, 'gpt2', header, ckpt_infinitrain.read_step(theirs).params)
    code, out, err = run_tool(capsys, 'diff', theirs, ours)
    assert code == 0 and out.rstrip().endswith('identical'), out + err
    assert 'model config differs' not in out
    # The fields only ours records, grouped by their first part, on lines of at most 100 characters.
    lines = out.splitlines()
    start = lines.index('not recorded by A, so not compared (the tensors are):')
    block = list(itertools.takewhile(lambda line: line.startswith('  '), lines[start + 1 :]))
    assert block and max(map(len, block)) <= 100
    model_part = ' '.join(block).split('model_config: ')[1].split('  ')[0]  # up to the next group's line
    assert all(field in model_part for field in dataclasses.asdict(header)), block
    code, out, _ = run_tool(capsys, 'diff', theirs, ours, '--json')
    result = json.loads(out)
    assert result['identical'] and result['fields'] == []
    one_side = {f['field'] for f in result['recorded_by_one_side']}
    assert one_side >= {'model_config.num_layers', 'data_position'}


@needs_samples
def test_gzipped_sample_steps_are_named_with_the_gunzip_hint(real, capsys, tmp_path):
    """head-llama3 ships its step files gzipped (the samples' README): ls names them InfiniTrain's,
    gzipped, and says how to unpack them; show is one line with the command; the unpacked copy
    of the same root lists both steps committed."""
    packed = SAMPLES / 'head-llama3' / 'a'
    code, out, err = run_tool(capsys, 'ls', packed, '--json')
    assert code == 0, err
    listed = {Path(e['path']).name: e for e in json.loads(out)['checkpoints']}
    for name in ('checkpoint_step_000010', 'checkpoint_step_000020'):
        assert listed[name]['kind'] == 'infinitrain'
        assert listed[name]['status'] == 'gzipped: model.ckpt.gz, optimizer.ckpt.gz'
    code, out, err = run_tool(capsys, 'ls', packed)
    assert f'2 step(s) hold gzipped InfiniTrain files: gunzip {packed}/*/*.gz to use them' in out
    assert 'orbax' not in out and 'incomplete' not in out
    step = packed / 'checkpoint_step_000010'
    for argv in (['show', step], ['verify', step], ['diff', step, step]):
        code, out, err = run_tool(capsys, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and 'damaged' not in err, argv
        # The shared samples are read-only: gunzip cannot unpack them where they lie.
        assert f'read-only: copy the step elsewhere and gunzip there: cp -r {step} DIR' in err, argv
    writable = tmp_path / step.name
    shutil.copytree(step, writable)
    writable.chmod(0o755)
    from jaxtrain.checkpoint.layout import CheckpointError
    from jaxtrain.checkpoint.resume import resolve_resume

    with pytest.raises(CheckpointError, match=re.escape(f'unpack them first: gunzip {writable}/*.gz')):
        resolve_resume(str(writable), '')  # --resume_from STEP
    code, out, err = run_tool(capsys, 'ls', real / 'head-llama3' / 'a', '--json')
    assert [e['status'] for e in json.loads(out)['checkpoints']] == ['committed', 'committed']
    from jaxtrain.tools import generate

    assert generate.main(['--checkpoint', str(packed)]) == 2  # a root of them: its step's one line
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and 'gunzip' in err and 'model.ckpt.gz' in err


@needs_samples
def test_show_prints_one_short_line_a_field(real, tmp_path, capsys):
    """`ckpt show` for people: mappings as name=value pairs wrapped at 100 columns, upstream's shape
    fields said to be its config defaults (the real head-gpt2 files hold 2 layers of 96 channels but
    record GPT2Config()'s 12 x 768), and jaxtrain's record named by its fields, not dumped."""
    step = real / 'head-gpt2/a/checkpoint_step_000010'
    code, out, err = run_tool(capsys, 'show', step)
    assert code == 0, err
    assert _wrapped_at_100(out)
    fields = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(' ')}
    assert 'num_layers=2 channels=96' in fields['model']
    assert 'n_layer=12' in fields['shape_fields'] and 'n_embd=768' in fields['shape_fields']
    assert "upstream's config defaults" in out
    ours = tmp_path / 'ours' / 'checkpoint_step_000010'
    pr_step = real / 'pr-gpt2/a/checkpoint_step_000010'  # its model.bin header gives the shape
    code, _, err = run_tool(capsys, 'export', pr_step, '--format', 'infinitrain', '--output', ours)
    assert code == 0, err
    code, out, err = run_tool(capsys, 'show', tmp_path / 'ours' / 'checkpoint_step_000010')
    assert code == 0, err
    assert _wrapped_at_100(out)
    jaxtrain_row = next(line for line in out.splitlines() if line.startswith('jaxtrain '))
    assert 'fields (' in jaxtrain_row and '--json' in out


def _wrapped_at_100(text: str) -> bool:
    """Every line within 100 columns, but for one that is a single word after its key (a long path
    cannot be broken)."""
    return all(len(line) <= 100 or len(line.split()) <= 2 for line in text.splitlines())
