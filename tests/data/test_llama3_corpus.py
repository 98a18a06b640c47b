"""LLaMA-3's built-in corpus: the GPT-2 corpus's bytes as the same ids, each file after
<|begin_of_text|> 128000 (llm.c's dev/data delimiter for llama-3), in LLaMA-3 shards
(magic 20240801, version 7, uint32: docs/formats.md §3); `configs/llama3.py:tiny` trains on it
with no files given."""

import math

import numpy as np
import pytest

from jaxtrain.data import default_corpus
from trainer_runs import load_config, train


def read_shard(path, dtype):
    """An llm.c token shard read with plain NumPy: 256 int32 header, then the tokens."""
    raw = open(path, 'rb').read()
    return np.frombuffer(raw[:1024], '<i4'), np.frombuffer(raw[1024:], dtype)


@pytest.fixture
def small_corpus(tmp_path, monkeypatch):
    """The corpus recipe over two known files, with a small validation tail."""
    stdlib = tmp_path / 'stdlib'
    (stdlib / 'pkg').mkdir(parents=True)
    (stdlib / 'a.py').write_bytes(b'print("a")\n' * 300)
    (stdlib / 'pkg' / 'b.py').write_bytes('x = "wörld"\n'.encode() * 300)
    real_build = default_corpus.build_tokens
    monkeypatch.setattr(default_corpus, 'VAL_TOKENS', 1024)
    monkeypatch.setattr(default_corpus, 'build_tokens', lambda: real_build(str(stdlib), total_tokens=7000))
    return stdlib


def test_llama3_corpus_is_the_gpt2_bytes_in_uint32_shards(tmp_path, small_corpus):
    gpt2_train, gpt2_val = default_corpus.ensure_default_corpus(tmp_path / 'c', family='gpt2')
    llama_train, llama_val = default_corpus.ensure_default_corpus(tmp_path / 'c', family='llama3')
    assert llama_train != gpt2_train and 'llama3' in llama_train
    for gpt2_path, llama_path in ((gpt2_train, llama_train), (gpt2_val, llama_val)):
        gpt2_header, gpt2_ids = read_shard(gpt2_path, '<u2')
        header, ids = read_shard(llama_path, '<u4')
        assert header[:3].tolist() == [20240801, 7, len(ids)] and len(ids) == len(gpt2_ids)
        starts = gpt2_ids == 50256
        assert np.array_equal(ids == 128000, starts)
        assert np.array_equal(ids[~starts], gpt2_ids[~starts])
    _, ids = read_shard(llama_train, '<u4')
    first = (b'print("a")\n' * 300)[: len(ids) - 1]
    assert ids[0] == 128000 and np.array_equal(ids[1 : 1 + len(first)], default_corpus.encode_bytes(first))


@pytest.mark.slow
def test_llama3_tiny_trains_with_no_files(tmp_path, small_corpus, monkeypatch):
    monkeypatch.setenv('JAXTRAIN_CACHE', str(tmp_path / 'cache'))
    config = load_config('llama3', 'tiny', metrics_dir=str(tmp_path / 'm'), num_iteration=2)
    assert config.input_bin == ''
    code, losses, out = train(config)
    assert code == 0, out
    assert 'llama3_train.bin' in out and 'uint32' in out
    # random init over a 128256-id vocabulary: about ln(128256); tiny's 1e-2 then learns at once
    assert sorted(losses) == [1, 2] and abs(losses[1] - math.log(128256)) < 0.5 and losses[2] < losses[1]
