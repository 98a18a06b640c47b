"""llm.c's run folder (model, state, DONE) and its shuffled loader order, against llm.c's own files.

The references are independent of llmc_io: the real files train_gpt2cu wrote (tests/fixtures/llmc_run,
README there), the header bytes unpacked here from train_gpt2.cu's save_state layout, rand.h's
documented mt19937 outputs, and llm.c's dataloader.h itself compiled into a small C harness.
"""

import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import llmc_io
from jaxtrain.data.stream import LLMCShuffledStream
from llmc_io import llmc_run
from llmc_io.errors import LLMCFormatError
from llmc_io.llmc_state import MT19937, LLMCOrder, flat_to_tree, read_state, tree_to_flat, write_state

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / 'tests' / 'fixtures' / 'llmc_run'
LLMC = Path('/work/shared/peers/llm.c')
N = 628_480  # the fixture model's parameters (V = Vp = 8192, maxT 64, L 2, C 64)


def _raw_header(path):
    ints = np.fromfile(path, '<i4', count=256)
    u64 = lambda slot: struct.unpack('<Q', ints[slot : slot + 2].tobytes())[0]
    return ints, u64


@pytest.mark.parametrize(
    'name, master', [('a/state_00000010_00000.bin', True), ('w0/state_00000010_00000.bin', False)]
)
def test_state_header_and_arrays_as_save_state_lays_them_out(name, master):
    path = RUN / name
    ints, u64 = _raw_header(path)
    state = read_state(path, N)
    assert (ints[0], ints[1], ints[2], ints[3]) == (20240527, 1, 1, 0)
    assert state.step == ints[10] == 10
    assert state.use_master_weights is master and ints[4] == int(master)
    assert (state.rng_state, state.rng_state_last_update) == (u64(20), u64(22))
    assert (state.current_shard_idx, state.current_sample_idx) == (u64(30), u64(32)) == (1, 5)
    # m, v (and master weights) follow the header back to back, fp32.
    body = np.fromfile(path, '<f4', offset=1024, count=(3 if master else 2) * N)
    np.testing.assert_array_equal(state.m, body[:N])
    np.testing.assert_array_equal(state.v, body[N : 2 * N])
    assert (state.v >= 0).all() and np.abs(state.m).max() > 0
    if master:
        np.testing.assert_array_equal(state.master, body[2 * N :])
        # llm.c's bf16 params are its master weights rounded (stochastically): within one bf16 ulp.
        _, model = llmc_io.load_gpt2(RUN / 'a' / 'model_00000010.bin')
        wte = flat_to_tree(state.master, llmc_io.model_info(RUN / 'a' / 'model_00000010.bin').header)
        m, w = model['wte']['embedding'], wte['wte']['embedding']
        assert np.all(np.abs(m - w) <= np.abs(w) * 2**-7 + 1e-30)


@pytest.mark.parametrize(
    'name', ['a/state_00000010_00000.bin', 'a/state_00000020_00000.bin', 'w0/state_00000010_00000.bin']
)
def test_state_written_back_is_byte_identical(tmp_path, name):
    source = RUN / name
    state = read_state(source, N)
    write_state(tmp_path / 'state.bin', state)
    assert (tmp_path / 'state.bin').read_bytes() == source.read_bytes()


def test_flat_vector_and_tree_round_trip():
    header = llmc_io.model_info(RUN / 'a' / 'model_00000010.bin').header
    master = read_state(RUN / 'a' / 'state_00000010_00000.bin', N).master
    tree = flat_to_tree(master, header)
    assert tree['h']['attn']['c_attn']['kernel'].shape == (2, 64, 192)  # (in, out) in the tree
    np.testing.assert_array_equal(tree_to_flat('x', tree, header), master)


def test_mt19937_gives_rand_h_documented_values():
    rng = MT19937(137)  # llmc/rand.h's comment: the same numbers as torch.manual_seed(137)
    assert [rng.randint32() for _ in range(5)] == [4053805790, 2173880614, 380293709, 1237255315, 2986595568]


@pytest.mark.parametrize('step', [10, 20])
def test_shuffle_state_in_llmc_state_file_equals_our_replay(step):
    saved = read_state(RUN / 'a' / f'state_{step:08d}_00000.bin', N)
    shard, sample, ours = LLMCOrder([5, 5]).loader_state_after(step)
    assert (shard, sample) == (saved.current_shard_idx, saved.current_sample_idx)
    np.testing.assert_array_equal(ours.shard_indices, saved.shuffle.shard_indices)
    np.testing.assert_array_equal(ours.intra_shard_indices, saved.shuffle.intra_shard_indices)
    assert (ours.rng.left, ours.rng.next) == (saved.shuffle.rng.left, saved.shuffle.rng.next)
    np.testing.assert_array_equal(ours.rng.words, saved.shuffle.rng.words)


# ---- llm.c's dataloader.h itself, compiled -------------------------------------------------------


@pytest.fixture(scope='module')
def harness(tmp_path_factory):
    cc = shutil.which('cc')
    if cc is None or not (LLMC / 'llmc' / 'dataloader.h').is_file():
        pytest.skip('needs a C compiler and llm.c (/work/shared/peers/llm.c)')
    exe = tmp_path_factory.mktemp('harness') / 'harness'
    subprocess.run(
        [
            cc,
            '-O1',
            '-I',
            str(LLMC / 'llmc'),
            '-o',
            str(exe),
            str(Path(__file__).parent / 'llmc_loader_harness.c'),
            '-lm',
        ],
        check=True,
        capture_output=True,
    )
    return exe


def _run_harness(exe, pattern, B, T, n):
    out = subprocess.run(
        [str(exe), pattern, str(B), str(T), str(n)], check=True, capture_output=True, text=True
    ).stdout
    lines = [line.split() for line in out.splitlines()]
    batches = [np.array(list(map(int, words[1:]))) for words in lines if words[0] == 'batch']
    rest = {words[0]: list(map(int, words[1:])) for words in lines if words[0] != 'batch'}
    return batches, rest


def _write_shard(path, tokens):
    header = np.zeros(256, np.int32)
    header[:3] = 20240520, 1, len(tokens)
    path.write_bytes(header.tobytes() + np.asarray(tokens, np.uint16).tobytes())


def _assert_same_loader(stream, position, rest):
    shard, sample, ours = stream.loader_state(position)
    assert rest['state'] == [shard, sample]
    assert rest['shards'] == ours.shard_indices.tolist()
    assert rest['intra'] == ours.intra_shard_indices.tolist()
    assert rest['mt'] == [ours.rng.left, ours.rng.next] + ours.rng.words.tolist()


def test_fixture_shards_give_llmc_batches_bit_for_bit(harness):
    pattern = str(RUN / 'data' / 'tiny_train_*.bin')
    batches, rest = _run_harness(harness, pattern, 4, 64, 20)
    stream = LLMCShuffledStream(pattern, 256, 64, 8192, accumulation=1)
    for k, tokens in enumerate(batches):
        x, y = stream.window(k)
        np.testing.assert_array_equal(x.ravel(), tokens[:-1], err_msg=f'batch {k}')
        np.testing.assert_array_equal(y.ravel(), tokens[1:], err_msg=f'batch {k}')
    _assert_same_loader(stream, 20, rest)


def test_uneven_shards_many_epochs_and_accumulation_match_llmc(harness, tmp_path):
    """Three shards of different sizes (so shard_num_samples changes shard to shard), 7 epochs; one
    of our windows with accumulation 3 is three consecutive llm.c batches, across shard ends."""
    rng = np.random.default_rng(5)
    for i, ntok in enumerate((97, 161, 50)):
        _write_shard(tmp_path / f'shard_{i}.bin', rng.integers(0, 300, ntok))
    pattern = str(tmp_path / 'shard_*.bin')
    B, T, n = 2, 8, 3 * 35  # samples per shard: 6, 10, 3 -> 19 per epoch
    batches, rest = _run_harness(harness, pattern, B, T, n)
    stream = LLMCShuffledStream(pattern, 3 * B * T, T, 300, accumulation=3)
    for position in range(n // 3):
        x, y = stream.window(position)
        want = batches[3 * position : 3 * position + 3]
        np.testing.assert_array_equal(x.reshape(3, -1), [t[:-1] for t in want])
        np.testing.assert_array_equal(y.reshape(3, -1), [t[1:] for t in want])
    _assert_same_loader(stream, n // 3, rest)
    assert stream.epoch_of(n // 3) == n // 19


def test_default_order_is_unchanged():
    from jaxtrain.data.stream import TokenStream

    pattern = str(RUN / 'data' / 'tiny_train_*.bin')
    plain = TokenStream(pattern, 256, 64, 8192)
    first = llmc_io.shards.read_shard(RUN / 'data' / 'tiny_train_000001.bin')
    np.testing.assert_array_equal(plain.window(0)[0].ravel(), first[:256])
    shuffled = LLMCShuffledStream(pattern, 256, 64, 8192, accumulation=1)
    assert not np.array_equal(plain.window(0)[0], shuffled.window(0)[0])


# ---- the run folder and bad input ---------------------------------------------------------------


def test_run_folder_steps_and_read_step():
    assert llmc_run.committed_steps(RUN / 'a') == [10, 20]
    step = llmc_run.read_step(RUN / 'a', 20, need_master=True)
    assert step.model_version == 5 and step.header.vocab_size == 8192 and step.state.step == 20


def _copy_run(tmp_path, steps=(10,), src='a'):
    run = tmp_path / 'run'
    run.mkdir()
    for step in steps:
        for f in (RUN / src).glob(f'*{step:08d}*'):
            shutil.copy(f, run / f.name)
    return run


def _snapshot(run):
    return {p.name: p.read_bytes() for p in sorted(run.iterdir())}


def _patch_int(path, slot, value):
    data = bytearray(path.read_bytes())
    data[4 * slot : 4 * slot + 4] = struct.pack('<i', value)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    'damage, field, words',
    [
        ('version', 'header[1] version', ['expected 1', 'found 2']),
        ('ranks', 'num_processes', ['expected 1 / 0', 'found 2 / 0']),
        ('rank_file', 'state files of step 10', ['expected 1', 'found 2']),
        ('done', 'DONE marker', ['step 10 was never completed', 'no step there is committed']),
        ('master', 'use_master_weights', ['-w 0']),
        ('no_state', 'state file', ['expected present', 'found missing', 'copy the whole run folder']),
        ('long_state', 'size', ['64 bytes more than the header and the loader state', 'added after']),
        ('short_state', 'size', ['bytes short: the file is truncated']),
    ],
)
def test_bad_input_is_one_line_and_nothing_is_touched(tmp_path, damage, field, words):
    run = _copy_run(tmp_path, src='w0' if damage == 'master' else 'a')
    state = run / 'state_00000010_00000.bin'
    if damage == 'version':
        _patch_int(state, 1, 2)
    elif damage == 'ranks':
        _patch_int(state, 2, 2)
    elif damage == 'rank_file':
        shutil.copy(state, run / 'state_00000010_00001.bin')
    elif damage == 'done':
        (run / 'DONE_00000010').unlink()
    elif damage == 'no_state':
        state.unlink()
    elif damage in ('long_state', 'short_state'):
        data = state.read_bytes()
        state.write_bytes(data + bytes(64) if damage == 'long_state' else data[: len(data) // 2])
    before = _snapshot(run)
    with pytest.raises(LLMCFormatError) as e:
        llmc_run.read_step(run, 10, need_master=True)
    message = str(e.value)
    assert '\n' not in message and field in message, message
    for word in words:
        assert word in message, message
    if damage in ('no_state', 'long_state'):  # neither is a multi-process run nor a truncated file
        assert 'multi-process' not in message and 'truncated' not in message, message
    assert _snapshot(run) == before


def test_missing_done_names_the_newest_committed_step(tmp_path):
    run = _copy_run(tmp_path, steps=(10, 20))
    (run / 'DONE_00000020').unlink()
    with pytest.raises(LLMCFormatError, match='step 20 was never completed; the newest committed step is 10'):
        llmc_run.read_step(run, 20)
    assert llmc_run.committed_steps(run) == [10]


@pytest.mark.parametrize(
    'shards, seq_len, field',
    [
        (['tiny_train_000001.bin'], 64, 'shuffle state: num_shards'),  # one shard of the two
        (['tiny_train_000001.bin', 'tiny_train_000002.bin'], 32, 'shuffle state: shard_num_samples'),
    ],
)
def test_shuffle_state_for_other_shards_is_refused(tmp_path, shards, seq_len, field):
    from jaxtrain.checkpoint.formats.llmc_run.restore import check_loader

    for name in shards:
        shutil.copy(RUN / 'data' / name, tmp_path / name)
    stream = LLMCShuffledStream(
        str(tmp_path / 'tiny_train_*.bin'), 4 * seq_len, seq_len, 8192, accumulation=1
    )
    step = llmc_run.read_step(RUN / 'a', 10)
    with pytest.raises(LLMCFormatError) as e:
        check_loader(step.state_path, step.state, stream, 10)
    assert e.value.field == field and '\n' not in str(e.value) and 'pass the ones it used' in str(e.value)


def test_another_step_of_the_same_shards_is_refused():
    """The state at step 20 checked as if it were step 10: same sizes, another permutation."""
    from jaxtrain.checkpoint.formats.llmc_run.restore import check_loader

    stream = LLMCShuffledStream(str(RUN / 'data' / 'tiny_train_*.bin'), 256, 64, 8192, accumulation=1)
    step = llmc_run.read_step(RUN / 'a', 20)
    check_loader(step.state_path, step.state, stream, 20)
    with pytest.raises(LLMCFormatError, match='intra_shard_indices'):
        check_loader(step.state_path, step.state, stream, 10)


def test_fp32_model_file_v3_is_read_too(tmp_path):
    """llm.c's fp32 build writes version 3 model files beside the same state layout."""
    run = _copy_run(tmp_path)
    header, params = llmc_io.load_gpt2(run / 'model_00000010.bin')
    llmc_io.save_gpt2(run / 'model_00000010.bin', header, params, version=3)
    step = llmc_run.read_step(run, 10)
    assert step.model_version == 3 and step.state.master is not None


def test_a_step_written_leaves_no_name_llm_c_would_take_for_a_done_marker(tmp_path, monkeypatch):
    """train_gpt2cu -y 1 resumes the highest step of any name starting "DONE_" (llm.c utils.h
    find_max_step), so a temporary of the marker that a kill left, DONE_%08d.*.tmp, would pass for a
    committed step: the marker is created in place, never under a temporary name."""
    import tempfile

    step = llmc_run.read_step(RUN / 'a', 10, need_master=True)
    params = flat_to_tree(step.state.master, step.header)
    temporaries = []
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, name = real_mkstemp(*args, **kwargs)
        temporaries.append(os.path.basename(name))
        return fd, name

    monkeypatch.setattr(tempfile, 'mkstemp', mkstemp)
    llmc_run.write_step(tmp_path, step.header, params, step.state, exported_from='x')
    assert sorted(t.split('.')[0] for t in temporaries) == [
        'jaxtrain_export_00000010',
        'model_00000010',
        'state_00000010_00000',
    ]
    assert not [t for t in temporaries if t.startswith('DONE_')]
    assert llmc_run.committed_steps(tmp_path) == [10] and (tmp_path / 'DONE_00000010').stat().st_size == 0
