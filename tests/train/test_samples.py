"""Samples during training (train/samples.py): a run resumed from a checkpoint prints the same
samples as the uninterrupted run; the sampled tokens are checked against the NumPy reference
(tests/numpy_reference.py) on the checkpointed params; sample time is logged on its own; when
samples are due; bad tokenizer files are one line before training starts; the sampler's decoder
runs the layers as the run does (scanned or unrolled)."""

import json
import re
import struct

import jax
import ml_collections
import numpy as np
import pytest

import numpy_reference as ref
from llmc_io.errors import LLMCFormatError
from text_tokenizers import train_bpe
from trainer_runs import load_config, random_shard, restore_params, tiny_llmc_model, train
from jaxtrain.train.samples import TrainingSampler, sample_interval

VOCAB = 512  # tiny_llmc_model's vocabulary


def tokenizer_file(path, count=VOCAB, eot=VOCAB - 1):
    """An llm.c tokenizer file (train_gpt2.py write_tokenizer's layout) whose piece i is '<i>'."""
    pieces = [f'<{i}>'.encode() for i in range(count)]
    header = struct.pack('<256i', *([20240328, 2, count, eot] + [0] * 252))
    path.write_bytes(header + b''.join(bytes([len(p)]) + p for p in pieces))
    return str(path)


def samples(out: str) -> dict[int, list[int]]:
    """{step: sampled ids} from a run's stdout (the text between the '---' lines after a sample line)."""
    found = {}
    for step, text in re.findall(r'step\s+(\d+)/\d+ \| sample \(.*?\n---\n(.*?)\n---', out, re.S):
        found[int(step)] = [int(i) for i in re.findall(r'<(\d+)>', text)]
    return found


@pytest.mark.slow
def test_resumed_run_prints_the_same_samples(tmp_path):
    common = dict(
        input_bin=random_shard(tmp_path / 'train.bin'),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        tokenizer_bin=tokenizer_file(tmp_path / 'tok.bin'),
        num_iteration=4,
        save_steps=2,
        sample_every=2,
        text_length=10,
        learning_rate=1e-3,
    )
    full = load_config('gpt2', checkpoint_dir=str(tmp_path / 'a'), metrics_dir=str(tmp_path / 'ma'), **common)
    code, _, out_full = train(full)
    assert code == 0, out_full
    resumed = load_config(
        'gpt2',
        checkpoint_dir=str(tmp_path / 'b'),
        resume_from=str(tmp_path / 'a' / 'checkpoint_step_000002'),
        **common,
    )
    code, _, out_resumed = train(resumed)
    assert code == 0, out_resumed
    a, b = samples(out_full), samples(out_resumed)
    assert sorted(a) == [2, 4] and sorted(b) == [4]
    assert len(a[4]) == 9 and b[4] == a[4] and a[2] != a[4]
    assert 'not in the step time' in out_full

    # Every sampled token is among the reference's 40 likeliest after its prefix (top-k 40, from EOT).
    params = jax.tree.map(np.asarray, restore_params(tmp_path / 'a' / 'checkpoint_step_000004'))
    ids = [VOCAB - 1] + a[4]
    logits = ref.gpt2_logits(params, 2, np.array([ids]))[0, :, :VOCAB]
    for t in range(1, len(ids)):
        assert ids[t] in np.argsort(logits[t - 1])[-40:]

    rows = [json.loads(line) for line in (tmp_path / 'ma' / 'metrics.jsonl').read_text().splitlines()]
    timed = {r['step']: r for r in rows if 'sample_s' in r}
    assert sorted(timed) == [2, 4] and all(r['sample_s'] > 0 for r in timed.values())
    assert timed[2]['sample_compile_s'] > 0 and timed[4]['sample_compile_s'] == 0  # compiled once


def _config(family='gpt2', **overrides):
    base = dict(
        sample_every=0,
        freq_generate_txt=10,
        tokenizer_bin='',
        tokenizer='',
        text_length=64,
        num_iteration=25,
        input_bin='x',
        scan_layers=True,
    )
    base.update(overrides)
    base['model_family'] = family
    return ml_collections.ConfigDict(base)


def test_when_samples_are_due():
    assert sample_interval(_config(sample_every=5)) == (5, True)  # llm.c: every N and the last step
    assert sample_interval(_config(tokenizer_bin='t.bin')) == (10, False)  # InfiniTrain: with a tokenizer
    assert sample_interval(_config(tokenizer='tokenizer.json')) == (10, False)  # a BPE tokenizer too
    assert sample_interval(_config()) == (0, False)
    assert sample_interval(_config(sample_every=0, freq_generate_txt=0, tokenizer_bin='t.bin')) == (0, False)
    # The default (-1): after the last step of a run on the built-in corpus (the default job), else never.
    assert sample_interval(_config(sample_every=-1, input_bin='')) == (0, True)
    assert sample_interval(_config(sample_every=-1)) == (0, False)
    assert sample_interval(_config(sample_every=0, input_bin='')) == (0, False)
    # LLaMA-3's built-in corpus is byte-level too: its default job prints a sample as GPT-2's does.
    assert sample_interval(_config('llama3', sample_every=-1, input_bin='')) == (0, True)
    assert sample_interval(_config('llama3', sample_every=-1)) == (0, False)


def test_bad_tokenizer_files_are_one_line(tmp_path):
    from flax import nnx

    from jaxtrain.models.gpt2 import GPT2, GPT2Config

    model_config = GPT2Config(
        max_seq_len=16, vocab_size=VOCAB, padded_vocab_size=VOCAB, num_layers=1, num_heads=1, channels=8
    )
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: GPT2(model_config, rngs=nnx.Rngs(0))), nnx.Param)
    bad = tmp_path / 'bad.bin'
    bad.write_bytes(open(tokenizer_file(tmp_path / 'ok.bin'), 'rb').read()[:-2])
    with pytest.raises(LLMCFormatError, match='token 511 bytes'):
        TrainingSampler(_config(tokenizer_bin=str(bad)), graphdef, model_config, 5, True)
    small = tokenizer_file(tmp_path / 'small.bin', count=100, eot=99)
    with pytest.raises(
        ValueError, match="expected at least 512 tokens \\(the model's vocab_size\\), found 100"
    ):
        TrainingSampler(_config(tokenizer_bin=small), graphdef, model_config, 5, True)
    with pytest.raises(ValueError, match='samples start from EOT 50256, which a vocab_size of 512 lacks'):
        TrainingSampler(_config(), graphdef, model_config, 5, True)


def test_the_sampler_decodes_the_layers_as_the_run_runs_them(tmp_path):
    """A scan_layers run samples with the layers in a scan (one block compiled), an unrolled run
    unrolled; the tokens are the same either way."""
    import llmc_io
    from flax import nnx

    from jaxtrain.models.gpt2 import GPT2, GPT2Config

    header, params = llmc_io.load_model(tiny_llmc_model(tmp_path / 'model.bin'))
    fields = GPT2Config.__dataclass_fields__
    model_config = GPT2Config(**{k: v for k, v in vars(header).items() if k in fields})
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: GPT2(model_config, rngs=nnx.Rngs(0))), nnx.Param)
    tokenizer = tokenizer_file(tmp_path / 'tok.bin')
    params, key = jax.tree.map(np.asarray, params), np.array([0, 42], np.uint32)
    tokens = {}
    for scan in (True, False):
        config = _config(tokenizer_bin=tokenizer, text_length=8, scan_layers=scan)
        sampler = TrainingSampler(config, graphdef, model_config, 5, True)
        assert sampler.decoder.options.layers == ('scan' if scan else 'unrolled')
        tokens[scan] = sampler.sample(params, key, 5)['tokens']
    assert tokens[True] == tokens[False] and len(tokens[True]) == 8


@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
def test_samples_decode_with_a_bpe_tokenizer(tmp_path, family):
    import tokenizers
    from flax import nnx

    import llmc_io
    from jaxtrain.models import FAMILIES

    tokenizer_json = train_bpe(tmp_path / 'tokenizer.json', family, vocab_size=VOCAB)
    hf = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    header, params = llmc_io.load_model(tiny_llmc_model(tmp_path / 'model.bin', family))
    model_cls, config_cls, _ = FAMILIES[family]
    fields = config_cls.__dataclass_fields__
    model_config = config_cls(**{k: v for k, v in vars(header).items() if k in fields})
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_cls(model_config, rngs=nnx.Rngs(0))), nnx.Param)
    # The previous test's length: GPT-2's sampler is its scanned one, compiled once for both.
    config = _config(tokenizer=str(tokenizer_json), text_length=8)
    config.model_family = family
    sampler = TrainingSampler(config, graphdef, model_config, 5, True)
    result = sampler.sample(jax.tree.map(np.asarray, params), np.array([0, 42], np.uint32), 5)
    # Samples start from the tokenizer's end of text: GPT-2 <|endoftext|>, LLaMA-3 <|end_of_text|>.
    start = '<|endoftext|>' if family == 'gpt2' else '<|end_of_text|>'
    assert result['tokens'][0] == hf.token_to_id(start) and len(result['tokens']) == 8
    assert sampler.start_name == start  # the sample line says what it starts from
    assert result['text'] == hf.decode(result['tokens'][1:], skip_special_tokens=False)
    assert isinstance(result['text'], str) and result['text']


@pytest.mark.slow  # the plain LLaMA-3 job (16.5M parameters, 10 steps): about 20 s on 2 cores
def test_plain_llama3_job_learns_and_its_samples_decode_to_text(tmp_path, capsys):
    """configs/llama3.py with no flags: the loss falls far below ln(128256) ≈ 11.76 in its 10 steps, it
    prints a sample decoded as text, and `generate` on its checkpoint decodes byte-level text too."""
    from jaxtrain.tools import generate

    ck, metrics = str(tmp_path / 'ck'), str(tmp_path / 'm')
    config = load_config('llama3', '', checkpoint_dir=ck, save_steps=10, metrics_dir=metrics)
    code, losses, out = train(config)
    assert code == 0, out
    assert sorted(losses) == list(range(1, 11))
    assert abs(losses[1] - np.log(128256)) < 0.2 and losses[10] < 7.0, losses
    text = re.search(r'sample \(64 tokens from <\|begin_of_text\|>.*?\n---\n(.*?)\n---', out, re.S).group(1)
    assert 'token ids' not in text and text.count('\ufffd') < len(text) / 4, text
    assert generate.main(['--checkpoint', ck, '--max_new_tokens', '48']) == 0
    shown = capsys.readouterr().out.split('--- sample 1/1\n')[1]
    assert shown.startswith('<|begin_of_text|>') and shown.count('\ufffd') < 12, shown
