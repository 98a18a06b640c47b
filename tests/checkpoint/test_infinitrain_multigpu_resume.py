"""Resuming jaxtrain from a multi-GPU InfiniTrain save, on the fake CPU devices (tests/conftest.py).

The real step-10 samples are laid out as a tensor- and pipeline-parallel run saves them
(tests/infinitrain_rank_fixtures.py, after upstream's code) and resumed on a jaxtrain mesh with tensor
parallelism over 4 and 2 devices, which shards them differently again (batch 2 leaves no room for data
parallelism without changing the step); steps 11-20 must print the real resume's b.log
losses within 1e-5, as the one-rank samples do in tests/checkpoint/test_infinitrain_resume.py.
"""

import re

import pytest

from infinitrain_rank_fixtures import write_run
from infinitrain_samples import SAMPLES, run_keys, saved_step_tensors, unpacked
from trainer_runs import load_config, train

pytestmark = pytest.mark.slow


def _log_losses(path):
    found = (re.search(r'step\s+(\d+)/\d+\s+\|\s+train loss\s+([\d.]+)', line) for line in open(path))
    return {int(m.group(1)): float(m.group(2)) for m in found if m}


# (folder, InfiniTrain layout written, jaxtrain mesh resumed on); data parallelism is left out of the saved
# layouts because it changes which batches a step reads (b.log is a one-GPU run).
CASES = [
    (
        'head-gpt2',
        {'tp': 2, 'pp': 2, 'sequence_parallel': True},
        {'num_devices': 4, 'mesh_tensor': 4, 'mesh_fsdp': 1, 'mesh_data': 1},
    ),
    pytest.param(
        'head-llama3',
        {'pp': 2},
        {'num_devices': 2, 'mesh_tensor': 2, 'mesh_fsdp': 1, 'mesh_data': 1},
        # Compared with the binary's log, not with a program compiled here: XLA's optimizations (fusing
        # the 128256-token logits' elementwise work) make these steps several times cheaper.
        marks=pytest.mark.xla_optimized,
    ),
]


@pytest.mark.parametrize('folder,saved,mesh', CASES, ids=['head-gpt2', 'head-llama3'])
def test_resume_from_a_multi_gpu_layout_matches_the_real_resume(tmp_path, folder, saved, mesh):
    if not SAMPLES.is_dir():
        pytest.skip(f'{SAMPLES} absent')
    real = unpacked()
    step = real / folder / 'a' / 'checkpoint_step_000010'
    family, model, adam, t = saved_step_tensors(step)
    split = write_run(
        tmp_path / 'split' / 'checkpoint_step_000010',
        family,
        model,
        adam,
        t,
        step=10,
        consumed=10,
        lr=0.01,
        **saved,
    )
    config = load_config(
        family,
        **run_keys(real, folder),
        resume_from=str(split),
        metrics_dir=str(tmp_path / 'metrics'),
        **mesh,
    )
    code, losses, out = train(config)
    assert code == 0, out
    assert 'restored step 10' in out and f'{len(list(split.iterdir()))} rank directories' in out
    reference = _log_losses(real / folder / 'b.log')
    assert sorted(losses) == list(range(11, 21))
    assert max(abs(losses[s] - reference[s]) for s in reference) < 1e-5
