"""The seed's experiment on tiny models: a run resumed from a checkpoint prints the same
losses, bit for bit, and ends with the same parameters as the uninterrupted run."""

import jax
import numpy as np
import pytest

from trainer_runs import load_config, random_shard, restore_params, tiny_llmc_model, train

pytestmark = pytest.mark.slow  # two whole runs per case, each case its own compiled step

CASES = {
    'gpt2-fp32': dict(family='gpt2'),
    'gpt2-bf16-accumulation': dict(family='gpt2', dtype='bfloat16', total_batch_size=512),
    'llama3-fp32': dict(family='llama3'),
    'llama3-bf16-accumulation': dict(family='llama3', dtype='bfloat16', total_batch_size=512),
}


@pytest.mark.parametrize('case', CASES)
def test_resumed_run_matches_uninterrupted_bitwise(tmp_path, case):
    options = dict(CASES[case])
    family = options.pop('family')
    shard = random_shard(tmp_path / 'train.bin', kind=family)
    model = tiny_llmc_model(tmp_path / 'model.bin', family)
    common = dict(
        input_bin=shard,
        llmc_filepath=model,
        num_iteration=4,
        save_steps=2,
        max_checkpoint_keep=10,
        save_optimizer_state=True,
        learning_rate=1e-3,
        **options,
    )

    full = load_config(
        family, checkpoint_dir=str(tmp_path / 'noresume'), metrics_dir=str(tmp_path / 'm1'), **common
    )
    code, full_losses, _ = train(full)
    assert code == 0 and sorted(full_losses) == list(range(1, 5))

    resumed = load_config(
        family,
        checkpoint_dir=str(tmp_path / 'resumefrom2'),
        metrics_dir=str(tmp_path / 'm2'),
        resume_from=str(tmp_path / 'noresume' / 'checkpoint_step_000002'),
        **common,
    )
    code, resumed_losses, out = train(resumed)
    assert code == 0
    assert 'restored step 2' in out
    assert sorted(resumed_losses) == [3, 4]
    assert [resumed_losses[s] for s in (3, 4)] == [full_losses[s] for s in (3, 4)]
    assert full_losses[4] < full_losses[1]

    a = restore_params(tmp_path / 'noresume' / 'checkpoint_step_000004')
    b = restore_params(tmp_path / 'resumefrom2' / 'checkpoint_step_000004')
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
