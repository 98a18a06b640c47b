"""--keep_best N: the N checkpoints with the lowest validation loss (as the run printed it at
their step) survive max_checkpoint_keep's rotation, in both formats and across a resume, and
`ckpt ls` marks them. The validation shard is another phrase than the training shard, so the
validation loss rises as the model learns the training phrase and the best steps are early ones."""

import json
import re

import pytest

import llmc_io
from jaxtrain.checkpoint.keep import recorded_val_losses
from jaxtrain.tools import ckpt
from trainer_runs import load_config, random_shard, tiny_llmc_model, train, write_checkpoint

VAL_LINE = re.compile(r'step\s+(\d+)/\d+ \| val loss ([\d.]+)')


def _steps(root):
    return sorted(
        int(p.name.rsplit('_', 1)[1]) for p in root.iterdir() if p.name.startswith('checkpoint_step_')
    )


def _lowest(val: dict, n: int) -> set:
    return {step for _, step in sorted((loss, step) for step, loss in val.items())[:n]}


@pytest.mark.slow
@pytest.mark.parametrize('fmt', ['orbax', 'infinitrain'])
def test_the_best_by_validation_loss_survive_rotation(tmp_path, fmt, capsys):
    common = dict(
        input_bin=random_shard(tmp_path / 'train.bin', seed=0),
        input_val_bin=random_shard(tmp_path / 'val.bin', seed=1),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        learning_rate=3e-3,
        val_loss_every=2,
        val_max_steps=1,
        save_steps=2,
        max_checkpoint_keep=1,
        keep_best=2,
        checkpoint_format=fmt,
        checkpoint_dir=str(tmp_path / 'ck'),
    )
    code, _, out = train(load_config('gpt2', num_iteration=10, **common))
    assert code == 0, out
    val = {int(m[1]): float(m[2]) for m in VAL_LINE.finditer(out)}
    assert sorted(val) == [2, 4, 6, 8, 10]
    best = _lowest(val, 2)
    assert best != {8, 10}  # the validation loss rose: the newest are not the best
    assert _steps(tmp_path / 'ck') == sorted(best | {10})
    if fmt == 'orbax':  # its rotation lines (train/saving.py) say why the others went
        assert "not among keep_best's lowest validation losses" in out

    if fmt == 'orbax':  # resumed: the earlier best stay protected, ranked with the new steps' losses
        code, _, more = train(load_config('gpt2', num_iteration=14, resume_from='latest', **common))
        assert code == 0, more
        val.update({int(m[1]): float(m[2]) for m in VAL_LINE.finditer(more)})
        best = _lowest(val, 2)
        # The newest, the best two, and the step it resumed from (never rotated away).
        assert _steps(tmp_path / 'ck') == sorted(best | {10, 14})

    capsys.readouterr()
    assert ckpt.main(['ls', str(tmp_path / 'ck'), '--json']) == 0
    listed = json.loads(capsys.readouterr().out)['checkpoints']
    assert {e['step'] for e in listed if e['kept_best']} == best
    assert all(e['val_loss'] == pytest.approx(val[e['step']], abs=5e-7) for e in listed)
    assert ckpt.main(['ls', str(tmp_path / 'ck')]) == 0
    table = capsys.readouterr().out
    for step in best:
        assert re.search(rf'^\s*{step}\s.*best \(val {val[step]:.6f}\)', table, re.M), table


def test_keep_best_needs_validation_at_the_save_steps():
    from jaxtrain.checks.config_checks import check_config

    with pytest.raises(ValueError, match='keep_best: expected --val_loss_every N > 0'):
        check_config(load_config('gpt2', keep_best=2, save_steps=4))
    with pytest.raises(
        ValueError, match='keep_best: expected save_steps to be a multiple of val_loss_every 3'
    ):
        check_config(load_config('gpt2', keep_best=2, save_steps=4, val_loss_every=3))

    with pytest.raises(ValueError, match=r'keep_best: .* found --checkpoint_format llmc .*drop --keep_best'):
        check_config(
            load_config(
                'gpt2', keep_best=2, save_steps=2, val_loss_every=2, checkpoint_format='llmc', shuffle='llmc'
            )
        )


def test_a_record_whose_digest_fails_is_never_ranked_best(tmp_path, capsys):
    """A val_loss edited by hand (record_sha256 no longer matches) is not a loss the run measured:
    neither the run's ranking (recorded_val_losses) nor `ckpt ls` counts it. Nor does `ckpt ls`
    rank a step of another lineage (another run's, in the same root) against the newest run's."""
    header, params = llmc_io.load_model(tiny_llmc_model(tmp_path / 'model.bin'))
    root = tmp_path / 'ck'
    training = {'optimizer': 'adamw', 'save_optimizer_state': False, 'keep_best': 1}
    for step, val_loss, lineage in ((1, 0.5, 'another run'), (2, 5.0, 'this run'), (4, 6.0, 'this run')):
        record = dict(val_loss=val_loss, training_config=training, lineage=lineage)
        write_checkpoint(root, step, 'gpt2', header, params, **record)
    assert recorded_val_losses(root) == {1: 0.5, 2: 5.0, 4: 6.0}
    record_file = root / 'checkpoint_step_000004' / 'trainer_state' / 'metadata'
    record = json.loads(record_file.read_text())
    record_file.write_text(json.dumps({**record, 'val_loss': 1.0}))
    assert recorded_val_losses(root) == {1: 0.5, 2: 5.0}
    capsys.readouterr()
    assert ckpt.main(['ls', str(root), '--json']) == 0
    kept = {e['step']: e['kept_best'] for e in json.loads(capsys.readouterr().out)['checkpoints']}
    assert kept == {1: False, 2: True, 4: False}
