"""TokenStream against hand-made llm.c shards whose every token is known.

Shards are written here with plain NumPy (1024-byte int32 header [magic, version, ntok], then the
tokens), independently of llmc_io, and hold tokens equal to their own offsets (plus a per-shard base),
so every expected window can be written down from llm.c's rule: batch b = tokens [b*B*T, (b+1)*B*T + 1).
"""

import numpy as np
import pytest

from jaxtrain.data.stream import DataError, TokenStream

GPT2 = (20240520, 1, np.uint16)
LLAMA3 = (20240801, 7, np.uint32)


def write_shard(path, tokens, kind=GPT2, magic=None):
    magic_expected, version, dtype = kind
    header = np.zeros(256, "<i4")
    header[:3] = [magic if magic is not None else magic_expected, version, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype).astype(np.dtype(dtype).newbyteorder("<")).tobytes())
    return str(path)


def llmc_batch(tokens, b, B, T):
    """llm.c's unshuffled batch b, written from docs/formats.md §3 rather than from TokenStream."""
    chunk = np.asarray(tokens[b * B * T : (b + 1) * B * T + 1], np.int32)
    return chunk[:-1].reshape(B, T), chunk[1:].reshape(B, T)


@pytest.fixture
def two_shards(tmp_path):
    """Shard 0: tokens 0..40 (41 tokens); shard 1: 1000..1032 (33 tokens); B=2, T=4 -> 8 tokens/step."""
    first = np.arange(41)
    second = 1000 + np.arange(33)
    write_shard(tmp_path / "data_000.bin", first)
    write_shard(tmp_path / "data_001.bin", second)
    return tmp_path, first, second


def test_windows_are_llmc_batches_in_shard_order(two_shards):
    tmp_path, first, second = two_shards
    stream = TokenStream(str(tmp_path / "data_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=2000)
    # (41 - 1) // 8 = 5 windows, then (33 - 1) // 8 = 4.
    assert stream.windows_per_shard == [5, 4]
    assert stream.windows_per_epoch == 9
    expected = [llmc_batch(first, b, 2, 4) for b in range(5)] + [
        llmc_batch(second, b, 2, 4) for b in range(4)
    ]
    for position, (want_x, want_y) in enumerate(expected):
        x, y = stream.window(position)
        assert x.dtype == np.int32 and y.dtype == np.int32
        assert x.shape == y.shape == (2, 4)
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(y, want_y)


def test_window_contents_written_out(two_shards):
    tmp_path, _, _ = two_shards
    stream = TokenStream(str(tmp_path / "data_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=2000)
    x, y = stream.window(1)
    np.testing.assert_array_equal(x, [[8, 9, 10, 11], [12, 13, 14, 15]])
    np.testing.assert_array_equal(y, [[9, 10, 11, 12], [13, 14, 15, 16]])
    # First window of the second shard: never a token of shard 0 (windows do not cross shards).
    x, y = stream.window(5)
    np.testing.assert_array_equal(x, [[1000, 1001, 1002, 1003], [1004, 1005, 1006, 1007]])
    np.testing.assert_array_equal(y, [[1001, 1002, 1003, 1004], [1005, 1006, 1007, 1008]])


def test_consecutive_windows_overlap_by_one_token(two_shards):
    tmp_path, _, _ = two_shards
    stream = TokenStream(str(tmp_path / "data_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=2000)
    for position in range(4):
        _, last_targets = stream.window(position)
        next_inputs, _ = stream.window(position + 1)
        assert last_targets[-1, -1] == next_inputs[0, 0]


def test_tail_of_shard_that_is_not_a_whole_window_is_skipped(tmp_path):
    # 20 tokens, 8 per step: windows [0, 9) and [8, 17); tokens 17..19 are never inputs.
    write_shard(tmp_path / "a.bin", np.arange(20))
    stream = TokenStream(str(tmp_path / "a.bin"), tokens_per_step=8, seq_len=8, vocab_size=100)
    assert stream.windows_per_epoch == 2
    np.testing.assert_array_equal(stream.window(1)[1], [[9, 10, 11, 12, 13, 14, 15, 16]])
    np.testing.assert_array_equal(stream.window(2)[0], [[0, 1, 2, 3, 4, 5, 6, 7]])  # wrapped


def test_wrap_and_epoch_count(two_shards):
    tmp_path, _, _ = two_shards
    stream = TokenStream(str(tmp_path / "data_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=2000)
    assert [stream.epoch_of(p) for p in (0, 8, 9, 17, 18, 9 * 7 + 3)] == [0, 0, 1, 1, 2, 7]
    assert stream.locate(0) == (0, 0, 0)
    assert stream.locate(8) == (0, 1, 3)
    assert stream.locate(9) == (1, 0, 0)
    assert stream.locate(9 * 7 + 6) == (7, 1, 1)
    for position in range(9):
        for later in (position + 9, position + 9 * 1000):
            np.testing.assert_array_equal(stream.window(later)[0], stream.window(position)[0])


def test_window_is_a_pure_function_of_position(two_shards):
    tmp_path, _, _ = two_shards
    stream = TokenStream(str(tmp_path / "data_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=2000)
    before = stream.window(6)
    for position in (3, 0, 8, 100):  # reading elsewhere must not move anything
        stream.window(position)
    after = stream.window(np.int64(6))
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    # A fresh stream (as after a restart) gives the same window for the same saved position.
    resumed = TokenStream(str(tmp_path / "data_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=2000)
    np.testing.assert_array_equal(resumed.window(6)[0], before[0])


def test_glob_is_sorted(tmp_path):
    write_shard(tmp_path / "s_b.bin", np.full(9, 2))
    write_shard(tmp_path / "s_a.bin", np.full(9, 1))
    write_shard(tmp_path / "s_c.bin", np.full(9, 3))
    stream = TokenStream(str(tmp_path / "s_*.bin"), tokens_per_step=8, seq_len=8, vocab_size=10)
    assert [int(stream.window(p)[0][0, 0]) for p in range(3)] == [1, 2, 3]


def test_llama3_uint32_shards(tmp_path):
    tokens = np.array([128000, 5, 70000, 128255, 9, 128000, 1, 2, 3], np.uint32)
    write_shard(tmp_path / "llama.bin", tokens, kind=LLAMA3)
    stream = TokenStream(str(tmp_path / "llama.bin"), tokens_per_step=4, seq_len=2, vocab_size=128256)
    assert stream.dtype == np.uint32
    x, y = stream.window(1)
    np.testing.assert_array_equal(x, [[9, 128000], [1, 2]])
    np.testing.assert_array_equal(y, [[128000, 1], [2, 3]])
    assert x.dtype == np.int32


def test_val_windows_are_the_first_windows(two_shards):
    tmp_path, first, _ = two_shards
    stream = TokenStream(
        str(tmp_path / "data_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=2000, name="val"
    )
    windows = list(stream.val_windows(3))
    assert len(windows) == 3
    for b, (x, y) in enumerate(windows):
        want_x, want_y = llmc_batch(first, b, 2, 4)
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(y, want_y)
    assert list(stream.val_windows(0)) == []
    with pytest.raises(DataError, match=r"0\.\.9.*found 10"):
        list(stream.val_windows(10))


def test_describe_names_files_tokens_and_dtype(two_shards):
    tmp_path, _, _ = two_shards
    stream = TokenStream(str(tmp_path / "data_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=2000)
    line = stream.describe()
    assert "2 files" in line and "74 tokens" in line and "uint16" in line and "9 windows" in line


# ---- errors ---------------------------------------------------------------------------------------


def test_empty_glob_names_the_pattern(tmp_path):
    pattern = str(tmp_path / "nothing_*.bin")
    with pytest.raises(DataError, match="matched no files") as error:
        TokenStream(pattern, tokens_per_step=8, seq_len=4, vocab_size=10)
    assert pattern in str(error.value)


def test_shard_too_short_for_one_window(tmp_path):
    write_shard(tmp_path / "a_0.bin", np.arange(100))
    short = write_shard(tmp_path / "a_1.bin", np.arange(8))
    with pytest.raises(DataError, match=r"expected at least tokens_per_step \+ 1 = 9 .*found 8") as error:
        TokenStream(str(tmp_path / "a_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=1000)
    assert short in str(error.value)


def test_token_id_at_or_above_vocab_is_refused_before_any_batch_of_its_shard(tmp_path):
    """An id the vocabulary lacks in shard 1's skipped tail (no window reads it): shard 0 trains,
    and the first read of shard 1 is refused, before any of its batches, naming the offset."""
    write_shard(tmp_path / "data_000.bin", np.arange(17))  # 2 windows
    tokens = np.arange(30)
    tokens[29] = 50257  # past the 3 windows of tokens 0..24
    bad = write_shard(tmp_path / "data_001.bin", tokens)
    stream = TokenStream(str(tmp_path / "data_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=50257)
    stream.window(0), stream.window(1)  # shard 0 is read; shard 1 is not opened yet
    with pytest.raises(DataError, match=r"offset 29: expected id < vocab_size 50257, found 50257") as error:
        stream.window(2)  # shard 1's first window, tokens 0..8
    assert bad in str(error.value)


def test_token_id_at_or_above_vocab_in_llmcs_shuffled_order(tmp_path):
    from jaxtrain.data.stream import LLMCShuffledStream

    tokens = np.arange(30)
    tokens[19] = 50257
    path = write_shard(tmp_path / "a.bin", tokens)
    stream = LLMCShuffledStream(path, tokens_per_step=8, seq_len=4, vocab_size=50257, accumulation=2)
    # Samples of 4 tokens: sample k reads tokens 4k .. 4k + 4, so sample 4 holds offset 19. A step
    # whose samples are others is refused too: the shard's first read checks all of it.
    position = next(p for p in range(6) if all(k != 4 for _, k in stream.samples_of(p)))
    with pytest.raises(DataError, match=r"offset 19: expected id < vocab_size 50257, found 50257"):
        stream.window(position)


def test_mixed_dtypes_are_rejected(tmp_path):
    write_shard(tmp_path / "m_0.bin", np.arange(20), kind=GPT2)
    llama = write_shard(tmp_path / "m_1.bin", np.arange(20), kind=LLAMA3)
    with pytest.raises(DataError, match=r"expected uint16 .*found uint32") as error:
        TokenStream(str(tmp_path / "m_*.bin"), tokens_per_step=8, seq_len=4, vocab_size=1000)
    assert llama in str(error.value)


def test_tokens_per_step_must_be_whole_rows(tmp_path):
    path = write_shard(tmp_path / "a.bin", np.arange(20))
    with pytest.raises(DataError, match="multiple of seq_len=4, found 10"):
        TokenStream(path, tokens_per_step=10, seq_len=4, vocab_size=100)


def test_negative_or_fractional_position(tmp_path):
    path = write_shard(tmp_path / "a.bin", np.arange(20))
    stream = TokenStream(path, tokens_per_step=8, seq_len=4, vocab_size=100)
    with pytest.raises(DataError, match="found -1"):
        stream.window(-1)
    with pytest.raises(TypeError):
        stream.window(1.0)


def test_bad_magic_is_reported_by_llmc_io(tmp_path):
    llmc_io = pytest.importorskip("llmc_io")
    if not hasattr(llmc_io, "LLMCFormatError"):
        pytest.skip("llmc_io.LLMCFormatError not available yet")
    path = write_shard(tmp_path / "a.bin", np.arange(20), magic=12345)
    with pytest.raises(llmc_io.LLMCFormatError, match="12345") as error:
        TokenStream(path, tokens_per_step=8, seq_len=4, vocab_size=100)
    assert path in str(error.value)
