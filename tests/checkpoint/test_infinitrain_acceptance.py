"""The seed's acceptance experiment with InfiniTrain-format checkpoints: train 100 steps saving every 20
with --checkpoint_format infinitrain (HEAD files) or infinitrain-bin (PR files), resume a second run from
step 40 with InfiniTrain's own flag spelling (--load / --resume_from), and InfiniTrain's loss comparison of
steps 41-100 finds zero difference; the two step-100 checkpoints diff identical.
One case per format, covering GPT-2 fp32 (SGD, no optimizer file) and LLaMA-3 bf16 (Adam).
The command lines go through the trainer's entry point in this process (cli_runs.run_cli), on one device
as a user's CPU run has; the experiment as real processes is tests/train/test_seed_experiment.py's."""

import pytest

from jaxtrain.checkpoint.formats.infinitrain import steps as it
from cli_runs import assert_resumed_run_matches, run_cli, seed_experiment_setup

pytestmark = pytest.mark.slow


def _run(config_file, *args, log):
    result = run_cli(*args, config=config_file)  # one device, as a user's CPU run has
    log.write(result.out + result.err)
    return result.code


@pytest.mark.parametrize(
    'family,dtype,fmt,optimizer,resume_flag',
    [
        ('gpt2', 'float32', 'infinitrain', 'sgd', '--load'),
        ('llama3', 'bfloat16', 'infinitrain-bin', 'adam', '--resume_from'),
    ],
)
def test_acceptance_with_infinitrain_checkpoints(tmp_path, family, dtype, fmt, optimizer, resume_flag):
    common, log_name = seed_experiment_setup(tmp_path, family, dtype)
    common += ['--optimizer', optimizer, '--checkpoint_format', fmt]
    config_file = f'configs/{family}.py'
    noresume, resumed = tmp_path / 'ck' / 'noresume', tmp_path / 'ck' / 'resumefrom40'
    with open(tmp_path / 'base' / log_name, 'w') as log:
        assert _run(config_file, *common, '--checkpoint_dir', noresume, log=log) == 0
    with open(tmp_path / 'test' / log_name, 'w') as log:
        code = _run(
            config_file,
            *common,
            '--checkpoint_dir',
            resumed,
            resume_flag,
            noresume / 'checkpoint_step_000040',
            log=log,
        )
    assert code == 0, (tmp_path / 'test' / log_name).read_text()[-2000:]
    assert [d.name[-6:] for d in it.step_dirs(noresume)] == ['000020', '000040', '000060', '000080', '000100']
    assert [d.name[-6:] for d in it.step_dirs(resumed)] == ['000060', '000080', '000100']
    assert {it.detect_kind(d) for d in it.step_dirs(noresume)} == {fmt}
    assert (noresume / 'checkpoint_step_000040' / it.FILES[fmt][1]).exists() == (optimizer == 'adam')
    assert_resumed_run_matches(
        tmp_path / 'base',
        tmp_path / 'test',
        noresume / 'checkpoint_step_000100',
        resumed / 'checkpoint_step_000100',
    )
