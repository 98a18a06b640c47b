"""checks/fit_checks.py: what depends on the devices and the model file is refused by
check_config, before the run creates its metrics or checkpoint directory, and train/
no longer validates."""

import ast
from pathlib import Path

import pytest

from cli_runs import run_cli
from jaxtrain.checks.config_checks import check_config
from trainer_runs import load_config, random_shard, tiny_llmc_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('fit')
    return dict(
        llmc_filepath=str(tiny_llmc_model(root / 'gpt2.bin')),  # max_seq_len 128 (trainer_runs)
        input_bin=str(random_shard(root / 'train.bin', num_tokens=4_000)),
    )


@pytest.mark.parametrize(
    'keys, message',
    [
        (
            dict(sequence_length=256, total_batch_size=1024),
            'sequence_length: expected at most the model max_seq_len 128, found 256; '
            'pass --sequence_length 128 or less',
        ),
        (
            dict(
                num_devices=2, mesh_tensor=2, sequence_parallel=True, sequence_length=63, total_batch_size=252
            ),
            'sequence_length: expected a multiple of the tensor size 2 with sequence_parallel, found 63; '
            'pass a --sequence_length that 2 divides, or a smaller --mesh_tensor',
        ),
        (
            dict(num_devices=2, pipeline_parallel=2, zero_stage=1, total_batch_size=512),
            'pipeline_parallel 2 with --zero_stage: not supported yet',
        ),
        (dict(num_devices=2, mesh_data=3), 'mesh: expected mesh_data × mesh_fsdp × mesh_tensor = 2 devices'),
        (dict(model='nonesuch', llmc_filepath=''), "model: expected one of"),
    ],
    ids=['max-seq-len', 'sequence-parallel', 'pipeline-with-zero', 'mesh', 'variant'],
)
def test_check_config_refuses_what_does_not_fit(files, keys, message):
    config = load_config('gpt2', **{**files, **keys})
    with pytest.raises(ValueError, match=message.replace('(', r'\(')) as error:
        check_config(config)
    assert '\n' not in str(error.value)


def test_a_run_that_does_not_fit_creates_nothing(files, tmp_path):
    """The shape is refused before metrics_dir and checkpoint_dir are made (build_trainer
    found it only after both existed)."""
    metrics, checkpoints = tmp_path / 'metrics', tmp_path / 'ck'
    result = run_cli(
        '--llmc_filepath',
        files['llmc_filepath'],
        '--input_bin',
        files['input_bin'],
        '--sequence_length',
        256,
        '--total_batch_size',
        1024,
        '--metrics_dir',
        metrics,
        '--checkpoint_dir',
        checkpoints,
        '--save_steps',
        1,
    )
    assert result.code == 1 and result.error_lines == [
        'error: sequence_length: expected at most the model max_seq_len 128, found 256; '
        'pass --sequence_length 128 or less (ValueError; --verbose for a traceback)'
    ]
    assert not metrics.exists() and not checkpoints.exists()


def test_train_does_not_validate():
    """check_config runs once, from the entry points; nothing under train/ calls it."""
    callers = [
        path.name
        for path in sorted((REPO / 'jaxtrain' / 'train').glob('*.py'))
        if any(
            isinstance(node, ast.Name)
            and node.id == 'check_config'
            or isinstance(node, ast.ImportFrom)
            and node.module == 'jaxtrain.checks.config_checks'
            for node in ast.walk(ast.parse(path.read_text()))
        )
    ]
    assert callers == []


def test_a_pipeline_of_no_chunks_is_refused_with_a_remedy():
    from jaxtrain.checks.fit_checks import check_pipeline

    want = 'virtual_pipeline_parallel: expected a positive number of chunks, found 0; pass 1 or more'
    with pytest.raises(ValueError) as error:
        check_pipeline(num_layers=4, stages=1, virtual=0, microbatches=1)
    assert str(error.value) == want
