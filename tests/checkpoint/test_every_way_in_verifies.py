"""Every way into a checkpoint verifies it alike: `ckpt verify`, `--init_from`, `ckpt export` (and
`--resume_from`: tests/train/test_llmc_resume.py, test_damaged_multi_rank_resume below) refuse each
damage below in one line naming the file, through one verification per format
(jaxtrain/checkpoint/registry.py verify). Each damage is made here: bytes flipped in an Orbax
tensor file, a weight edited in model.ckpt, a garbled llm.c bf16 model file, two ranks' model.ckpt
swapped, data-parallel replicas edited alike (which still agree with each other)."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from trainer_runs import load_config, random_shard, tiny_llmc_model, train, write_checkpoint

import llmc_io
from jaxtrain.checkpoint import registry
from jaxtrain.checkpoint.resume import read_init_weights
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.tools import ckpt
from llmc_io.infinitrain.statedict import read_state_dict, write_state_dict

LLMC_RUN = Path(__file__).resolve().parents[1] / 'fixtures' / 'llmc_run' / 'a'
STEP = 'checkpoint_step_000002'


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """An Orbax step 2 of the tiny GPT-2 (written by the trainer's Checkpointer, no training), and
    its exports as one InfiniTrain directory, as tensor-parallel ranks and as data-parallel ranks."""
    root = tmp_path_factory.mktemp('saved')
    header, params = llmc_io.load_model(tiny_llmc_model(root / 'm.bin'))
    step = write_checkpoint(root / 'orbax', 2, 'gpt2', header, params)
    for name, flags in (('one', []), ('tp', ['--tp', '2']), ('ddp', ['--ddp', '2'])):
        out = root / name / STEP
        assert ckpt.main(['export', str(step), '--format', 'infinitrain', '--output', str(out), *flags]) == 0
    return root


def copy_of(saved, name, tmp_path) -> Path:
    target = tmp_path / name / STEP
    shutil.copytree(saved / name / STEP, target)
    return target


def refusals(path, tmp_path, capsys) -> list[str]:
    """The first line of each way in: ckpt verify, --init_from, ckpt export."""
    capsys.readouterr()
    assert ckpt.main(['verify', str(path)]) == 1
    verify_out = capsys.readouterr().out.splitlines()
    assert verify_out[0].startswith('FAILED:')
    with pytest.raises(CheckpointError) as init_from:
        read_init_weights(str(path))
    output = tmp_path / 'exported.bin'
    assert ckpt.main(['export', str(path), '--format', 'infinitrain', '--output', str(tmp_path / 'x')]) == 2
    export_err = capsys.readouterr().err.strip().splitlines()
    assert not output.exists() and not (tmp_path / 'x').exists()
    lines = [verify_out[1].strip(), str(init_from.value), export_err[-1]]
    assert all('\n' not in line for line in lines)
    return lines


def test_an_orbax_step_with_a_corrupted_tensor_file_is_refused(saved, tmp_path, capsys):
    step = tmp_path / STEP
    shutil.copytree(saved / 'orbax' / STEP, step)
    data = max((p for p in (step / 'params').rglob('*') if p.is_file()), key=lambda p: p.stat().st_size)
    damaged = bytearray(data.read_bytes())
    middle = len(damaged) // 2
    damaged[middle : middle + 64] = bytes(b ^ 0xFF for b in damaged[middle : middle + 64])
    data.write_bytes(bytes(damaged))
    verify, init_from, export = refusals(step, tmp_path, capsys)
    assert verify.startswith(f'{step}/params/')
    assert init_from.startswith(f'init_from: {step}/params/') and 'Pass an intact checkpoint' in init_from
    assert f'ckpt export: {step}/params/' in export


def _edit_weight(path: Path, name: str, value: float):
    """Sets the first element of the tensor whose name ends with `name` (a rank's names may carry
    InfiniTrain's module. prefix)."""
    tensors = read_state_dict(path)
    name = next(key for key in tensors if key.endswith(name))
    weight = np.array(tensors[name].array)
    weight.reshape(-1)[0] = value
    tensors[name] = dataclasses.replace(tensors[name], array=weight)
    write_state_dict(path, tensors)


def test_an_infinitrain_step_with_an_edited_weight_is_refused(saved, tmp_path, capsys):
    step = copy_of(saved, 'one', tmp_path)
    _edit_weight(step / 'model.ckpt', 'transformer.h.0.ln_1.weight', 1000.0)
    for line in refusals(step, tmp_path, capsys):
        assert f'{step / "model.ckpt"}: sha256_of_64MiB_pieces: expected ' in line


def test_two_tensor_parallel_ranks_swapped_are_refused(saved, tmp_path, capsys):
    step = copy_of(saved, 'tp', tmp_path)
    first, second = step / 'rank_000000' / 'model.ckpt', step / 'rank_000001' / 'model.ckpt'
    first_bytes = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(first_bytes)
    for line in refusals(step, tmp_path, capsys):
        assert f'{first}: sha256_of_64MiB_pieces: expected ' in line


def test_data_parallel_replicas_edited_alike_are_refused(saved, tmp_path, capsys):
    step = copy_of(saved, 'ddp', tmp_path)
    for rank in ('rank_000000', 'rank_000001'):
        _edit_weight(step / rank / 'model.ckpt', 'transformer.h.1.ln_2.bias', 7.0)
    for line in refusals(step, tmp_path, capsys):
        assert f'{step / "rank_000000" / "model.ckpt"}: sha256_of_64MiB_pieces: expected ' in line
    record = json.loads((step / 'rank_000001' / 'trainer_state.json').read_text())['jaxtrain']
    recorded = record['sha256_of_64MiB_pieces']
    assert sorted(recorded) == [f'rank_00000{r}/model.ckpt' for r in (0, 1)]


def test_a_rank_whose_record_differs_is_refused(saved, tmp_path, capsys):
    step = copy_of(saved, 'ddp', tmp_path)
    other = step / 'rank_000001' / 'trainer_state.json'
    other.write_text(other.read_text().replace('"data_position": 2', '"data_position": 1'))
    assert ckpt.main(['verify', str(step)]) == 1
    assert f'{other}: jaxtrain: expected the record of ' in capsys.readouterr().out


def test_an_llmc_run_whose_bf16_model_was_garbled_is_refused(tmp_path, capsys):
    run = tmp_path / 'run'
    shutil.copytree(LLMC_RUN, run)
    model = run / 'model_00000020.bin'
    garbled = bytearray(model.read_bytes())
    garbled[2024:2034] = bytes(range(0x40, 0x4A))  # ten bf16 weights, each far from its master copy
    model.write_bytes(bytes(garbled))
    capsys.readouterr()
    assert ckpt.main(['verify', str(run)]) == 1
    assert f'{model}: 5 value(s) more than one bf16 step from the master weights' in capsys.readouterr().out
    with pytest.raises(CheckpointError, match=f'^init_from: {model}: 5 value'):
        read_init_weights(str(run))


def test_the_intact_copies_pass_every_way_in(saved):
    for path in (saved / 'orbax' / STEP, *(saved / name / STEP for name in ('one', 'tp', 'ddp')), LLMC_RUN):
        assert registry.refuse_damaged(path, 'init_from').problems == []
    family, _, what, _ = read_init_weights(str(saved / 'tp' / STEP))
    assert family == 'gpt2' and 'InfiniTrain checkpoint' in what


def test_force_never_writes_an_hf_folder_into_a_checkpoint_root(saved, tmp_path, capsys):
    root = tmp_path / 'root'
    shutil.copytree(saved / 'orbax', root)
    step = root / STEP
    capsys.readouterr()
    assert ckpt.main(['export', str(step), '--format', 'hf', '--output', str(root), '--force']) == 2
    assert 'found a checkpoint or a checkpoint root' in capsys.readouterr().err
    assert sorted(p.name for p in root.iterdir()) == [STEP]


def test_init_from_a_root_takes_its_newest_step_over_an_hf_folder_beside_it(saved, tmp_path):
    root = tmp_path / 'root'
    shutil.copytree(saved / 'orbax', root)
    # An HF folder's files, as an export with --force left them there before it was refused.
    (root / 'config.json').write_text(json.dumps({'architectures': ['GPT2LMHeadModel'], 'n_layer': 2}))
    (root / 'model.safetensors').write_bytes(b'{}')
    _, _, what, _ = read_init_weights(str(root))
    assert what == f'checkpoint {root / STEP}'


def resume_refused(saved, step, tmp_path):
    """The trainer's refusal to resume `step` with the tiny model it was saved from."""
    config = load_config(
        'gpt2',
        llmc_filepath=str(saved / 'm.bin'),
        input_bin=random_shard(tmp_path / 'train.bin', vocab=256),
        resume_from=str(step),
        num_iteration=3,
        sample_every=0,
    )
    with pytest.raises(CheckpointError) as refused:
        train(config)
    return refused


@pytest.mark.slow
def test_damaged_multi_rank_resume_is_refused(saved, tmp_path):
    """Two tensor-parallel ranks' model.ckpt swapped: the merged model has the same shapes, and the
    resume used to train from it with other losses."""
    step = copy_of(saved, 'tp', tmp_path)
    first, second = step / 'rank_000000' / 'model.ckpt', step / 'rank_000001' / 'model.ckpt'
    first_bytes = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(first_bytes)
    e = resume_refused(saved, step, tmp_path)
    assert str(e.value).startswith(f'{first}: sha256_of_64MiB_pieces: expected ') and '\n' not in str(e.value)


@pytest.mark.slow
def test_a_damaged_replica_the_resume_does_not_read_is_refused(saved, tmp_path):
    """Data-parallel replicas in a directory that records no sha256 (as InfiniTrain writes them): a
    resume reads rank 0 only, so a weight edited in rank 1's copy used to pass it while `ckpt verify`
    rejected it. The resume now refuses what verify rejects."""
    from llmc_io.infinitrain.state import read_trainer_state, write_trainer_state

    step = copy_of(saved, 'ddp', tmp_path)
    for rank in ('rank_000000', 'rank_000001'):  # no jaxtrain record: as InfiniTrain's own save
        path = step / rank / 'trainer_state.json'
        write_trainer_state(path, dataclasses.replace(read_trainer_state(path), jaxtrain=None))
    _edit_weight(step / 'rank_000001' / 'model.ckpt', 'transformer.h.1.ln_2.bias', 7.0)
    verified = registry.verify(step)
    assert verified.problems and 'rank_000001' in verified.problems[0]
    e = resume_refused(saved, step, tmp_path)
    assert str(e.value).startswith(f'resume_from: {verified.problems[0]}')
