"""--trace_steps FIRST-LAST traces exactly those steps of the real loop (train/step_trace.py): the
trace holds one train-step dispatch per traced step and none of the steps around them, the log
names the steps and the folder, and bad values are refused before the run in one line each."""

import gzip
import json
import re

import pytest
from trainer_runs import load_config, random_shard, tiny_llmc_model, train

from jaxtrain.checks.config_checks import check_config
from jaxtrain.train.step_trace import parse_steps


@pytest.mark.parametrize('text, steps', [('41-43', (41, 43)), ('7', (7, 7)), ('1-1', (1, 1))])
def test_steps_are_read_as_a_range_or_one_step(text, steps):
    assert parse_steps(text) == steps


@pytest.mark.parametrize('text', ['0-3', '5-4', 'a-b', '3-', '-3', '1-2-3'])
def test_other_step_specs_are_refused_naming_what_was_found(text):
    with pytest.raises(
        ValueError, match=rf"trace_steps: expected FIRST-LAST .* found {re.escape(repr(text))}"
    ):
        parse_steps(text)


@pytest.mark.parametrize(
    'overrides, message',
    [
        ({'trace_steps': '3-4'}, 'trace_dir: expected a directory for the trace of --trace_steps 3-4'),
        ({'trace_dir': 'tr'}, 'trace_steps: expected the steps to trace into --trace_dir tr'),
        (
            {'trace_steps': '9-12', 'trace_dir': 'tr'},
            'trace_steps: expected steps the run reaches (num_iteration 10)',
        ),
    ],
)
def test_a_trace_without_its_other_half_or_past_the_run_is_refused(overrides, message):
    config = load_config(num_iteration=10, **overrides)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_config(config)


def _outermost(events, name):
    """Events of that name not inside another of the same name (jax nests one per dispatch)."""
    spans = sorted(
        (e['ts'], e['ts'] + e['dur']) for e in events if e.get('ph') == 'X' and e.get('name') == name
    )
    outer, end = 0, float('-inf')
    for start, stop in spans:
        if start >= end:
            outer, end = outer + 1, stop
    return outer


@pytest.mark.slow  # a short training run under the profiler
def test_the_trace_holds_the_traced_steps_and_no_others(tmp_path):
    # The small-vocabulary model: a step of tiny's random init (50,257 tokens) costs about a
    # second of CPU, and the steps around the traced ones are part of what is checked.
    config = load_config(
        input_bin=random_shard(tmp_path / 'train.bin'),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        num_iteration=6,
        trace_steps='3-4',
        trace_dir=str(tmp_path / 'trace'),
        sample_every=0,
        metrics_dir=str(tmp_path / 'metrics'),
    )
    code, losses, out = train(config)
    assert code == 0 and sorted(losses) == [1, 2, 3, 4, 5, 6]
    (trace,) = (tmp_path / 'trace').glob('plugins/profile/*/perfetto_trace.json.gz')
    assert 'trace: steps 3-4 (' in out and str(trace.parent) in out, out
    assert 'trace: kernels' in out, out  # the device time per kernel (none on a CPU backend)
    with gzip.open(trace) as f:
        events = json.load(f)['traceEvents']
    assert _outermost(events, 'PjitFunction(train_step)') == 2


def test_a_trace_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / 'taken').write_text('')
    config = load_config(num_iteration=10, trace_steps='3-4', trace_dir=str(tmp_path / 'taken'))
    with pytest.raises(ValueError, match='trace_dir: .*taken: expected a directory'):
        check_config(config)
