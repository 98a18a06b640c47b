"""A trainer-state record with a field no save writes -- here with its digest recomputed, as a copied
or hand-repaired record has -- is refused by resume and reported by `ckpt verify`, in one line naming
the file and the field. Before, resume failed inside Python ('str' object has no attribute 'get',
'Python integer out of bounds for int32') and verify said OK to five of these."""

import json
import shutil

import pytest
from cli_runs import run_cli
from trainer_runs import random_shard, tiny_llmc_model

from jaxtrain.checkpoint import layout
from jaxtrain.checkpoint.trainer_state import with_digest
from jaxtrain.tools import ckpt

pytestmark = pytest.mark.slow  # the trainer, in this process


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    work = tmp_path_factory.mktemp('record_fields')
    common = ['--input_bin', random_shard(work / 'train.bin'), '--sample_every', 0]
    common += ['--llmc_filepath', tiny_llmc_model(work / 'm.bin')]
    result = run_cli(*common, '--num_iteration', 2, '--save_steps', 2, '--checkpoint_dir', work / 'ck')
    assert result.code == 0, result.err
    return work / 'ck' / layout.step_dir_name(2), common


CASES = {
    'data_position beyond int32': ('data_position', 2**40, 'data_position: expected an integer in [0, 2**31'),
    'training_config a string': ('training_config', 'x', "training_config: expected an object, found 'x'"),
    'topology a number': ('topology', 3, 'topology: expected an object, found 3'),
    'data a number': ('data', 5, "data: expected an object (the training data's identity) or null"),
    'a billion-rank LoRA': ('lora', {'rank': 10**9, 'alpha': 16.0}, 'lora.rank: expected an integer in [1, '),
    'a string for a dimension': ('model_config.num_layers', '2', 'model_config.num_layers: expected a'),
}


@pytest.mark.parametrize('case', CASES)
def test_a_malformed_field_is_named_by_verify_and_resume(saved, tmp_path, capsys, case):
    source, common = saved
    field, value, expected = CASES[case]
    step_dir = tmp_path / 'ck' / source.name
    shutil.copytree(source, step_dir)
    path = step_dir / layout.TRAINER_STATE_FILE
    record = json.loads(path.read_text())
    *parents, leaf = field.split('.')
    node = record
    for key in parents:
        node = node[key]
    node[leaf] = value
    del record['record_sha256']
    path.write_text(json.dumps(with_digest(record)))  # the digest is right: only the field is wrong

    capsys.readouterr()
    assert ckpt.main(['verify', str(step_dir)]) == 1
    assert f'{path}: {expected}' in capsys.readouterr().out
    result = run_cli(*common, '--num_iteration', 3, '--resume_from', step_dir)
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(f'error: {path}: {expected}'), result.error_lines[0]
