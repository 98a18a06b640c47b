"""--precision_check under jit: InfiniTrain's log lines and .npy files (docs/precision_checker_guide.md
at b24d92f), checked against a NumPy forward pass, and `python -m jaxtrain.compare_precision`
naming the first step and module where two runs differ."""

import re

import numpy as np
import pytest

import llmc_io
from numpy_reference import gpt2_logits, layer_norm
from trainer_runs import load_config, random_shard, tiny_llmc_model, train, write_shard

from jaxtrain.tools import compare_precision
from jaxtrain.models import precision_check


def test_parse_reads_upstreams_options_and_names_a_bad_one():
    config = precision_check.parse('level=1,path=/tmp/x,format=md5,save_tensors=true,md5_tolerance=1e-3')
    assert (config.level, config.path, config.format, config.save_tensors, config.md5_tolerance) == (
        1, '/tmp/x', 'md5', True, 1e-3
    )  # fmt: skip
    bad_ones = (('level=2', 'level: expected 0 or 1'), ('format=table', 'format'), ('lvl=1', "'lvl'"))
    for bad, words in bad_ones:
        with pytest.raises(ValueError, match=re.escape(words)):
            precision_check.parse(bad)


def test_lines_flag_non_finite_values_and_md5_quantises():
    simple = precision_check.PrecisionCheckConfig(level=1)
    values = np.array([1.5, np.nan, -2.0, np.inf])
    line = precision_check.tensor_line('[GAS-0] [L-0]', 'Block_forward', values, simple)
    assert line == (
        '[GAS-0] [L-0] Block_forward tensor[0]: dtype=float64 shape=(4) min=-2 max=1.5 mean=-0.25 '
        '[1.5, nan, -2, inf] [NaN:1 Inf:1] <- ERROR'
    )
    md5 = precision_check.PrecisionCheckConfig(level=1, format='md5', md5_tolerance=1e-3)
    close = [np.array([4.0003, 1.0], np.float32), np.array([4.0004, 1.0], np.float32)]
    hashes = {precision_check.tensor_line('c', 'n', a, md5).split('md5=')[1] for a in close}
    assert len(hashes) == 1
    exact = precision_check.PrecisionCheckConfig(level=1, format='md5')
    assert len({precision_check.tensor_line('c', 'n', a, exact) for a in close}) == 2


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('precision')
    shard = random_shard(root / 't.bin', num_tokens=4_000)
    # The same tokens but from the 258th on: step 1 reads the same first window of 4 x 64 tokens
    # and its last target, step 2 another window.
    tokens = np.array(llmc_io.read_shard(shard))
    tokens[257:] = np.random.default_rng(2).integers(0, 512, len(tokens) - 257)
    return {
        'model': tiny_llmc_model(root / 'gpt2.bin'),
        'shard': shard,
        'other_shard': write_shard(root / 'other.bin', tokens),
    }


def _run(files, path, num_iteration=1, shard='shard'):
    config = load_config(
        'gpt2',
        llmc_filepath=files['model'],
        input_bin=files[shard],
        num_iteration=num_iteration,
        learning_rate=1e-3,
        precision_check=f'level=1,path={path},save_tensors=true',
    )
    code, _, out = train(config)
    assert code == 0, out
    (run_dir,) = path.iterdir()
    assert re.fullmatch(r'\d{8}_\d{6}', run_dir.name)
    return run_dir


@pytest.mark.slow
def test_level_1_writes_every_module_forward_and_backward(files, tmp_path):
    run_dir = _run(files, tmp_path / 'pc')
    lines = (run_dir / 'precision_check_rank_0.log').read_text().splitlines()
    # 1 step x 1 micro-step x 2 layers x (attention, MLP, block) x (forward, backward), and [STEP 1].
    assert lines[0] == '[STEP 1]' and len(lines) == 1 + 2 * 3 * 2
    assert lines[3].startswith('[GAS-0] [L-0] Block_forward tensor[0]: dtype=float32 shape=(4,64,32) min=')
    assert lines[6].startswith('[GAS-0] [L-1] Block_1_forward ')
    assert lines[7].startswith('[GAS-0] [L-1] Block_backward ')  # the backward pass starts at the top
    assert all(line.endswith('[NaN:0 Inf:0]') for line in lines[1:])
    # The last block's output, through ln_f and the tied head, is the NumPy model's logits.
    _, params = llmc_io.load_gpt2(files['model'])
    tokens = llmc_io.read_shard(files['shard'])[: 4 * 64].reshape(4, 64)
    top = np.load(run_dir / 'rank_0' / 'Block_1_forward.npy')
    final = layer_norm(top.astype(np.float64), params['ln_f']['scale'], params['ln_f']['bias'])
    logits = final @ np.asarray(params['wte']['embedding'], np.float64).T
    np.testing.assert_allclose(logits, gpt2_logits(params, 2, tokens), atol=2e-4)
    assert f'min={float(top.min()):g} max={float(top.max()):g}' in lines[6]


@pytest.mark.slow
def test_compare_precision_names_the_first_step_and_module_that_differ(files, tmp_path, capsys):
    a = _run(files, tmp_path / 'a', num_iteration=2)
    same = _run(files, tmp_path / 'same', num_iteration=2)
    # Other data from step 2 on (a different learning rate would be a train step compiled anew).
    other = _run(files, tmp_path / 'other', num_iteration=2, shard='other_shard')
    assert compare_precision.main([str(a), str(same)]) == 0
    assert 'no difference: 24 tensors over 2 steps' in capsys.readouterr().out
    # Step 1 is computed from the same weights and batch; the other batch shows from step 2 on.
    assert compare_precision.main([str(tmp_path / 'a'), str(other)]) == 1
    out = capsys.readouterr().out
    assert out.startswith('first difference: step 2, CausalSelfAttention_forward [GAS-0] [L-0]'), out
