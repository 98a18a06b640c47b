"""Pipeline parallelism (jaxtrain/train/pipeline.py) on the 8 fake CPU devices of
conftest.py, held to the 1-device trainer, whose step is the plain micro-step scan:

- GPT-2 on pipeline 2 × fsdp 2 × tensor 2 gives the 1-device run's losses within fp32
  rounding; its checkpoint is the one global tree, so it resumes on the same layout bit
  for bit and on 1 device within fp32 rounding, and its trainer state records pp_size.
- A 1-device LLaMA-3 checkpoint (8 layers) continues on P = 4 × V = 2 (interleaved chunks)
  with the 1-device run's losses.
- The schedule's layer assignment and bubble against InfiniTrain's GPipe table (written
  out here from pipeline_schedule.cc), and the one-line errors.
"""

import pytest

from jaxtrain.checkpoint import trainer_state as ckpt_record
from jaxtrain.train import pipeline
from jaxtrain.checks.config_checks import check_config
from trainer_runs import load_config, random_shard, tiny_llmc_model, train, train_named

# 8 rows of 32 tokens a step: 8 microbatches on 1 device, 4 on fsdp 2.
COMMON = dict(
    num_iteration=4,
    save_steps=2,
    max_checkpoint_keep=10,
    batch_size=1,
    sequence_length=32,
    total_batch_size=256,
    learning_rate=1e-3,
)
PIPELINED = dict(num_devices=8, pipeline_parallel=2, mesh_fsdp=2, mesh_tensor=2)
TOLERANCE = 1e-5  # the same tokens every step; only the reduction order differs


@pytest.fixture(scope='module')
def one_device(files, tmp_path_factory):
    losses, _ = train_named(tmp_path_factory.mktemp('one'), 'one', files, COMMON, num_devices=1, save_steps=0)
    assert sorted(losses) == [1, 2, 3, 4] and losses[4] < losses[1]
    return losses


@pytest.fixture(scope='module')
def pipelined(files, tmp_path_factory):
    root = tmp_path_factory.mktemp('pipelined')
    losses, out = train_named(root, 'p2', files, COMMON, **PIPELINED)
    return root / 'p2' / 'ck', losses, out


def assert_close(losses, reference, steps, tolerance=TOLERANCE):
    assert sorted(losses) == list(steps)
    for step in steps:
        assert abs(losses[step] - reference[step]) <= tolerance, (step, losses[step], reference[step])


@pytest.mark.slow
def test_pipeline_losses_equal_the_one_device_run(one_device, pipelined):
    root, losses, out = pipelined
    assert_close(losses, one_device, range(1, 5))
    assert 'mesh pipeline 2 × data 1 × fsdp 2 × tensor 2' in out
    assert 'DP 2 (data x fsdp) x accumulation 4' in out  # the 4 micro-steps are the microbatches
    topology = ckpt_record.read_trainer_state(root / 'checkpoint_step_000002')['topology']
    assert (topology['pp_size'], topology['vpp_size']) == (2, 1)
    assert topology['mesh'] == {'pipeline': 2, 'data': 1, 'fsdp': 2, 'tensor': 2}


@pytest.mark.slow
def test_resume_on_the_same_layout_is_bit_for_bit(files, pipelined, tmp_path):
    root, reference, _ = pipelined
    losses, out = train_named(
        tmp_path, 'again', files, COMMON, resume_from=str(root / 'checkpoint_step_000002'), **PIPELINED
    )
    assert losses == {step: reference[step] for step in (3, 4)}
    assert 'same topology (8 cpu device(s) in 1 process(es), mesh pipeline 2 × data 1' in out


@pytest.mark.slow
def test_resume_a_pipeline_checkpoint_on_one_device(files, one_device, pipelined, tmp_path):
    root, _, _ = pipelined
    losses, out = train_named(  # saves nothing: no 1-device snapshot program compiled
        tmp_path,
        'one',
        files,
        COMMON,
        num_devices=1,
        save_steps=0,
        resume_from=str(root / 'checkpoint_step_000002'),
    )
    assert_close(losses, one_device, (3, 4))
    assert (
        'topology changed: saved on 8 cpu device(s) in 1 process(es), mesh pipeline 2 × data 1 × fsdp 2 × '
        'tensor 2, now 1 cpu device(s) in 1 process(es), mesh data 1 × fsdp 1 × tensor 1'
    ) in out


@pytest.mark.slow
def test_one_device_llama3_checkpoint_continues_interleaved_on_4_stages(tmp_path):
    """8 layers in 4 stages × 2 chunks: stage 0 runs layers 0 and 4. The 1-device run saves
    at step 1; the pipelined run resumes there, so its step-3 loss follows its own step-2
    update."""
    files = dict(
        input_bin=random_shard(tmp_path / 'train.bin', kind='llama3'),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin', family='llama3', num_layers=8),
    )
    keys = dict(COMMON, num_iteration=3, save_steps=1, **files)
    runs, outs = {}, {}
    for name, layout in (
        ('one', dict(num_devices=1)),
        (
            'p4v2',
            dict(
                num_devices=4,
                pipeline_parallel=4,
                virtual_pipeline_parallel=2,
                resume_from=str(tmp_path / 'one' / 'checkpoint_step_000001'),
                save_steps=0,  # saves nothing: no snapshot program compiled for the 4 stages
            ),
        ),
    ):
        config = load_config(
            'llama3',
            checkpoint_dir=str(tmp_path / name),
            metrics_dir=str(tmp_path / name),
            **{**keys, **layout},
        )
        code, runs[name], outs[name] = train(config)
        assert code == 0, outs[name]
    assert_close(runs['p4v2'], runs['one'], (2, 3))
    assert (
        'topology changed: saved on 1 cpu device(s) in 1 process(es), mesh data 1 × fsdp 1 × tensor 1, '
        'now 4 cpu device(s) in 1 process(es), mesh pipeline 4 × data 1 × fsdp 1 × tensor 1, '
        '2 chunks per stage'
    ) in outs['p4v2']


# --- the schedule and the errors (no training) -------------------------------------------


def test_chunks_are_interleaved_as_infinitrain_assigns_them():
    # InfiniTrain's GetStageInfo: global chunk = local chunk × P + stage.
    assert pipeline.stage_layers(8, 2, 2) == [[range(0, 2), range(4, 6)], [range(2, 4), range(6, 8)]]
    assert pipeline.stage_layers(4, 4, 1) == [[range(0, 1)], [range(1, 2)], [range(2, 3)], [range(3, 4)]]


def gpipe_idle_share(microbatches: int, stages: int) -> float:
    """Idle stage-steps of InfiniTrain's GPipe table (GenerateGPipeSchedule, V = 1): forward
    step s runs microbatch mb on chunk s - mb, for s < M + P - 1; the backward mirrors it."""
    steps = microbatches + stages - 1
    busy = sum(1 for s in range(steps) for mb in range(microbatches) if 0 <= s - mb < stages)
    return 1 - busy / (steps * stages)


def test_bubble_matches_the_gpipe_table():
    assert pipeline.bubble_fraction(4, 1, 8) == pytest.approx(gpipe_idle_share(8, 4))
    assert pipeline.bubble_fraction(2, 1, 4) == pytest.approx(gpipe_idle_share(4, 2))


@pytest.mark.parametrize(
    'keys,message',
    [
        (
            dict(num_devices=4, pipeline_parallel=4),
            r"^pipeline_parallel × virtual_pipeline_parallel: expected a divisor of the model's 2 layers, "
            r'found 4 × 1 = 4',
        ),
        (dict(num_devices=2, pipeline_parallel=4), r'^pipeline_parallel: expected at most the 2 devices'),
        (
            dict(num_devices=2, pipeline_parallel=2, batch_size=8),
            r'^total_batch_size: expected at least pipeline_parallel = 2 microbatches .* found 1',
        ),
        (dict(virtual_pipeline_parallel=2), r'^virtual_pipeline_parallel: expected 1 without pipeline'),
    ],
    ids=['layers', 'devices', 'microbatches', 'virtual-alone'],
)
def test_pipeline_errors_are_one_line(files, keys, message):
    config = load_config('gpt2', **files, **{**COMMON, 'save_steps': 0, **keys})
    with pytest.raises(ValueError, match=message) as error:
        check_config(config)
    assert '\n' not in str(error.value)
