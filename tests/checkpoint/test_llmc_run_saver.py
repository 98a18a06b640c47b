"""--checkpoint_format llmc refuses, before the run trains, what train_gpt2cu could not continue:
each refusal one line naming the key, what llm.c needs and what to pass."""

import pytest

from jaxtrain.checkpoint.formats.llmc_run.writer import refuse_unless_llmc_run
from jaxtrain.checkpoint.layout import CheckpointError
from trainer_runs import load_config

LLMC_RUN = dict(checkpoint_format='llmc', shuffle='llmc', optimizer='adamw')


@pytest.mark.parametrize(
    'family, change, words',
    [
        ('llama3', {}, "model_family: expected 'gpt2'"),
        ('gpt2', {'optimizer': 'adam'}, "optimizer: expected 'adamw'"),
        ('gpt2', {'shuffle': 'none'}, "shuffle: expected 'llmc'"),
        ('gpt2', {'save_optimizer_state': False}, 'save_optimizer_state: expected true'),
    ],
)
def test_what_train_gpt2cu_cannot_continue_is_refused(family, change, words):
    refuse_unless_llmc_run(load_config('gpt2', **LLMC_RUN))  # the run it can continue
    with pytest.raises(CheckpointError) as error:
        refuse_unless_llmc_run(load_config(family, **{**LLMC_RUN, **change}))
    message = str(error.value)
    assert message.startswith(f'checkpoint_format llmc: {words}') and '\n' not in message
    assert 'pass --' in message and 'save as orbax' in message
