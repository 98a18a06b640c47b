"""The resume refusal reads well: a GPT-2 checkpoint given to a LLaMA-3 run names the
family first and no `None` fields (those only one family has)."""

import dataclasses

from jaxtrain.checkpoint.trainer_state import compare_with_run
from jaxtrain.models import gpt2, llama3

TRAINING = {'optimizer': 'adamw', 'sequence_length': 64, 'total_batch_size': 256, 'learning_rate': 1e-4}


def _saved(family, model_config, **training):
    return {
        'model_family': family,
        'model_config': model_config,
        'training_config': {**TRAINING, 'model_family': family, **training},
    }


def test_gpt2_checkpoint_into_a_llama3_run_names_the_family_first_and_no_none():
    saved_model = dataclasses.asdict(gpt2.VARIANTS['tiny'])
    now_model = dataclasses.asdict(llama3.VARIANTS['tiny'])
    incompatible, changes = compare_with_run(
        _saved('gpt2', saved_model), now_model, {**TRAINING, 'model_family': 'llama3'}
    )
    assert incompatible[0] == "model_family: checkpoint 'gpt2', now 'llama3'"
    assert not any('None' in line for line in incompatible), incompatible
    shared = set(saved_model) & set(now_model)
    expected = sorted(k for k in shared if saved_model[k] != now_model[k])
    assert incompatible[1:] == [
        f'model_config.{k}: checkpoint {saved_model[k]!r}, now {now_model[k]!r}' for k in expected
    ]
    assert 'model_config.vocab_size: checkpoint 50257, now 128256' in incompatible
    assert changes == []


def test_another_variant_of_the_family_is_named_with_the_flag_that_fits():
    saved_model = dataclasses.asdict(gpt2.VARIANTS['tiny'])
    now_model = dataclasses.asdict(gpt2.VARIANTS['small'])
    now_training = {**TRAINING, 'model_family': 'gpt2', 'model': 'small'}
    incompatible, _ = compare_with_run(_saved('gpt2', saved_model, model='tiny'), now_model, now_training)
    assert incompatible[0] == "model: checkpoint 'tiny', now 'small' (pass --model tiny)"
    changed = sorted(k for k in saved_model if saved_model[k] != now_model[k])
    assert changed and incompatible[1:] == [
        f'model_config.{k}: checkpoint {saved_model[k]!r}, now {now_model[k]!r}' for k in changed
    ]


def test_same_family_field_only_on_one_side_is_named_once():
    now_model = dataclasses.asdict(gpt2.VARIANTS['tiny'])
    saved_model = {k: v for k, v in now_model.items() if k != 'padded_vocab_size'}  # an older record
    incompatible, _ = compare_with_run(
        _saved('gpt2', saved_model), now_model, {**TRAINING, 'model_family': 'gpt2'}
    )
    assert incompatible == [
        'model_config: fields only in the checkpoint: none; only in this run: padded_vocab_size'
    ]


def test_a_fitting_checkpoint_reports_only_the_allowed_changes():
    model = dataclasses.asdict(llama3.VARIANTS['tiny'])
    incompatible, changes = compare_with_run(
        _saved('llama3', model), model, {**TRAINING, 'model_family': 'llama3', 'learning_rate': 1e-3}
    )
    assert incompatible == [] and changes == ['learning_rate: checkpoint 0.0001, now 0.001']
