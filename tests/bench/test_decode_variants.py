"""bench/decode_variants.py and the decode figures of bench/figures.py: the numbers each line
reports are those of the runs it made (a tiny GPT-2 on CPU), a variant whose tokens differ from
those it must equal fails the process (and only such a one: weights cast at another point may
round differently in bf16), a bad plan is refused in one line, the decode figure reads generate's
--json, and the decode_variants figure refuses a failed script."""

import json
import statistics
import subprocess
from pathlib import Path

import numpy as np
import pytest
from bench_loader import load_bench


@pytest.fixture(scope='module')
def variants():
    return load_bench('decode_variants')


@pytest.fixture
def smaller_tiny(monkeypatch):
    """--model tiny as one narrow layer (GPT-2's vocabulary kept: the script prompts with EOT
    50256): what these tests check is the script's measuring and reporting, not the model, and
    the 'tiny' variant's 64 channels cost seconds of random init and unoptimized lm-head decoding."""
    from jaxtrain.models import gpt2

    monkeypatch.setitem(
        gpt2.VARIANTS, 'tiny', gpt2.GPT2Config(max_seq_len=8, num_layers=1, num_heads=1, channels=8)
    )


@pytest.mark.slow  # a benchmark's measuring run: three decode programs compiled and timed
def test_a_process_measures_each_variant_at_each_batch(variants, smaller_tiny, tmp_path, capsys):
    rows_file = tmp_path / 'rows.jsonl'
    argv = ['--child', 'no_graphs:unrolled,scan_nocast,select_u4', '--model', 'tiny', '--dtype', 'float32']
    assert variants.main([*argv, '--new_tokens', '3', '--batches', '2', '--json', str(rows_file)]) == 0
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [(r['flags'], r['variant'], r['batch']) for r in rows] == [
        ('no_graphs', name, 2) for name in ('unrolled', 'scan_nocast', 'select_u4')
    ]
    for row in rows:
        assert row['same_tokens'] is True and row['compared_with'] == 'unrolled'  # fp32: one kind
        assert len(row['runs_s']) == 3
        assert row['seconds'] == statistics.median(row['runs_s'])
        assert row['tokens_per_s'] == round(2 * 3 / row['seconds'], 1)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('decode ')]
    assert len(lines) == 3 and 'scan_nocast' in lines[1] and 'batch   2' in lines[1]


class _FakeDecoder:
    """Decoder's interface, no compiling: the tokens of a variant are those `tokens_of` gives its
    DecodeOptions (the same for every row and position)."""

    tokens_of = None

    def __init__(self, graphdef, config, *, batch_size, length, top_k, options):
        self.batch_size, self.length, self.options = batch_size, length, options
        self.compile_seconds = 0.0

    def timed(self, params, prompt, key, temperature):
        return np.full((self.batch_size, self.length), type(self).tokens_of(self.options), np.int32), 0.01


@pytest.mark.parametrize(
    'dtype, tokens_of, code, differing',
    [
        # bf16: the weights cast inside the loop round otherwise; the rest match their own kind.
        ('bfloat16', lambda o: 1 if o.cast_params else 2, 0, []),
        # positions_per_step changes how the loop is compiled, never the tokens.
        ('bfloat16', lambda o: o.positions_per_step, 1, ['unrolled_u4']),
        # float32: the casts do nothing, so every variant must give the first's tokens.
        ('float32', lambda o: 1 if o.cast_params else 2, 1, ['scan_nocast', 'unrolled_nocast']),
    ],
    ids=['bf16-cast-point', 'bf16-unroll', 'fp32-cast-point'],
)
def test_only_a_variant_that_must_match_fails_the_process(
    variants, smaller_tiny, monkeypatch, tmp_path, capsys, dtype, tokens_of, code, differing
):
    from jaxtrain.models import decode

    monkeypatch.setattr(_FakeDecoder, 'tokens_of', staticmethod(tokens_of))
    monkeypatch.setattr(decode, 'Decoder', _FakeDecoder)
    rows_file = tmp_path / 'rows.jsonl'
    argv = ['--child', 'default:unrolled,scan_nocast,unrolled_u4,unrolled_nocast', '--model', 'tiny']
    argv += ['--dtype', dtype, '--new_tokens', '3', '--batches', '1', '--json', str(rows_file)]
    assert variants.main(argv) == code
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [r['variant'] for r in rows if not r['same_tokens']] == differing
    if dtype == 'bfloat16':
        assert [r['compared_with'] for r in rows] == ['unrolled', 'scan_nocast', 'unrolled', 'scan_nocast']
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines if 'TOKENS DIFFER' in line] == differing


def test_the_decode_variants_figure_refuses_a_failed_script(tmp_path):
    """Rows were written, but the script exited 1 (a variant's tokens differed): no figure."""
    figures = load_bench('figures')
    call = figures.Call(tmp_path, steps=0)

    def run(name, command, timeout=300, env=None):
        row = {'flags': 'default', 'variant': 'unrolled', 'batch': 1, 'tokens_per_s': 900.0}
        Path(command[command.index('--json') + 1]).write_text(json.dumps(row) + '\n')
        (tmp_path / f'{name}.txt').write_text('decode default unrolled_u4 ... TOKENS DIFFER from unrolled\n')
        return subprocess.CompletedProcess(command, 1)

    call.run = run
    with pytest.raises(RuntimeError, match='exit 1'):
        figures.decode_variants(call)
    assert 'decode_variants' not in call.found


def test_a_bad_plan_is_refused_in_one_line(variants, capsys):
    with pytest.raises(SystemExit) as stopped:
        variants.main(['--plan', 'default:unrolled', 'turbo:unrolled'])
    assert stopped.value.code == 2
    assert "found 'turbo:unrolled'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="found 'default:fastest'"):
        variants.parse_plan(['default:fastest'])
    assert variants.parse_plan(variants.DEFAULT_PLAN)[0][0] == 'default'


def test_the_decode_figure_reads_generates_json(tmp_path, capsys):
    figures = load_bench('figures')
    call = figures.Call(tmp_path, steps=0)
    commands = []

    def run(name, command, timeout=300, env=None):
        commands.append(command)
        batch = int(command[command.index('--num_samples') + 1])
        seconds = 0.05 * (1 + batch / 16)
        timing = {'tokens_per_s': batch * 256 / seconds, 'ms_per_position': 1e3 * seconds / 256}
        Path(command[command.index('--json') + 1]).write_text(json.dumps(timing))
        return subprocess.CompletedProcess(command, 0)

    call.run = run
    figures.decode(call)
    assert call.found['decode'] == {
        'batch 1 tok/s': 4819,
        'batch 1 ms/position': 0.208,
        'batch 16 tok/s': 40960,
        'batch 16 ms/position': 0.391,
    }
    assert all(c[1:3] == ['-m', 'jaxtrain.generate'] for c in commands)
    assert [c[c.index('--num_samples') + 1] for c in commands] == ['1', '16']
    assert all('--warmup_runs' in c and 'bfloat16' in c and '256' in c for c in commands)
    assert 'decode: batch 1 tok/s 4819' in capsys.readouterr().out
