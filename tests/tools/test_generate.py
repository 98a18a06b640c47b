"""python -m jaxtrain.generate from an llm.c file and from a jaxtrain checkpoint holding the same
weights: greedy continuations against the NumPy reference forward pass (tests/numpy_reference.py),
the built-in and a hand-made tokenizer, tokens/s, and one-line errors."""

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import llmc_io
from llmc_io.llmc_state import LLMCState, tree_to_flat, write_state
import numpy_reference as ref
from infinitrain_samples import SAMPLES, needs_samples
from trainer_runs import write_checkpoint
from jaxtrain.checkpoint.formats.infinitrain import export as infinitrain_export
from jaxtrain.tools import generate

REPO = Path(__file__).resolve().parents[2]
HEADER = llmc_io.GPT2Header(
    max_seq_len=32, vocab_size=50257, padded_vocab_size=50304, num_layers=2, num_heads=2, channels=16
)


def random_params(shapes, seed):
    """A nested tree from llmc_io's flat {'h/ln_1/scale': shape} table, random N(0, 0.5) values."""
    rng, tree = np.random.default_rng(seed), {}
    for name, shape in shapes.items():
        *parents, leaf = name.split('/')
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = rng.normal(0, 0.5, shape).astype(np.float32)
    return tree


@pytest.fixture(scope='module')
def model_files(tmp_path_factory):
    """The same random GPT-2 weights as an llm.c file and as a checkpoint step."""
    root = tmp_path_factory.mktemp('gen')
    params = random_params(HEADER.param_shapes(), seed=0)
    params['wte']['embedding'][HEADER.vocab_size :] = 0
    llmc_io.save_gpt2(str(root / 'model.bin'), HEADER, params)
    write_checkpoint(root / 'ck', 3, 'gpt2', HEADER, params)
    return root, params


def _reference_greedy(params, prompt, new):
    tokens = list(prompt)
    for _ in range(new):
        logits = ref.gpt2_logits(params, HEADER.num_heads, np.array([tokens]))[0, -1, : HEADER.vocab_size]
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt) :]


def _run(capsys, *args):
    code = generate.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_greedy_from_llmc_file_and_checkpoint_match_the_reference(model_files, capsys, tmp_path):
    root, params = model_files
    expected = _reference_greedy(params, [50256, 7], 6)
    # A hand-made tokenizer whose piece i is the text "<i>", so the printed text shows the ids.
    pieces = [f'<{i}>'.encode() for i in range(HEADER.vocab_size)]
    header = struct.pack('<256i', *([20240328, 2, len(pieces), 50256] + [0] * 252))
    (tmp_path / 'tok.bin').write_bytes(header + b''.join(bytes([len(p)]) + p for p in pieces))
    # An llm.c run folder as train_gpt2cu -o writes it: the step's model and state files, then DONE.
    (tmp_path / 'run').mkdir()
    (tmp_path / 'run' / 'model_00000003.bin').write_bytes((root / 'model.bin').read_bytes())
    master = tree_to_flat(tmp_path, params, HEADER)  # fp32 master weights: the model's own values
    zeros = np.zeros_like(master)
    write_state(
        tmp_path / 'run' / 'state_00000003_00000.bin', LLMCState(step=3, m=zeros, v=zeros, master=master)
    )
    (tmp_path / 'run' / 'DONE_00000003').touch()
    sources = [['--llmc_filepath', root / 'model.bin'], ['--checkpoint', root / 'ck']]  # ck: an Orbax root
    # The Orbax step exported as InfiniTrain's HEAD files (jaxtrain's record of the shape inside).
    infinitrain_export.export(
        root / 'ck' / 'checkpoint_step_000003', tmp_path / 'it' / 'checkpoint_step_000003', 'infinitrain'
    )
    # And as a Hugging Face folder (config.json + model.safetensors), which --init_from reads too.
    from jaxtrain.checkpoint.formats.orbax import export as ckpt_export

    ckpt_export.export_hf(root / 'ck' / 'checkpoint_step_000003', tmp_path / 'hf')
    sources += [['--checkpoint', tmp_path / name] for name in ('run', 'it', 'hf')]
    for source in sources:
        code, out, err = _run(
            capsys,
            *source,
            '--prompt_ids',
            '50256,7',
            '--max_new_tokens',
            6,
            '--temperature',
            0,
            '--tokenizer_bin',
            tmp_path / 'tok.bin',
            '--num_samples',
            2,
        )
        assert code == 0, err
        texts = [line for line in out.splitlines() if line.startswith('<50256><7>')]
        assert texts == ['<50256><7>' + ''.join(f'<{i}>' for i in expected)] * 2
        assert re.search(r'decoded 12 new tokens in [\d.]+ s: [\d,.]+ tokens/s \(batch 2', out)


def test_builtin_tokenizer_and_sampling(model_files, capsys):
    root, _ = model_files
    # No tokenizer file: a GPT-2 vocabulary decodes with the built-in byte tokenizer; '--prompt' encodes.
    code, out, err = _run(
        capsys, '--llmc_filepath', root / 'model.bin', '--prompt', 'def ', '--max_new_tokens', 5
    )
    assert code == 0, err
    assert '--- sample 1/1' in out
    assert out.split('--- sample 1/1\n')[1].startswith('def ')


@pytest.mark.parametrize('warmup_runs', [1, 2])
def test_json_holds_the_timing_of_the_run_after_the_warmup(
    model_files, capsys, tmp_path, monkeypatch, warmup_runs
):
    from jaxtrain.models.decode import Decoder

    timed_calls = []
    real_timed = Decoder.timed

    def counted(self, *args, **kwargs):
        timed_calls.append(args)
        return real_timed(self, *args, **kwargs)

    monkeypatch.setattr(Decoder, 'timed', counted)
    root, _ = model_files
    out_json = tmp_path / 'timing.json'
    # The greedy test's prompt length, new tokens and batch: its decoder, compiled once for both.
    code, out, err = _run(
        capsys,
        *('--llmc_filepath', root / 'model.bin', '--prompt_ids', '50256,7', '--max_new_tokens', 6),
        *('--num_samples', 2, '--warmup_runs', warmup_runs, '--json', out_json),
    )
    assert code == 0, err
    assert len(timed_calls) == warmup_runs + 1  # the warm-ups, then the run that is timed
    timing = json.loads(out_json.read_text())
    assert (timing['family'], timing['batch'], timing['new_tokens'], timing['warmup_runs']) == (
        'gpt2',
        2,
        12,
        warmup_runs,
    )
    assert timing['tokens_per_s'] == pytest.approx(12 / timing['seconds'])
    # A position is a step of the loop, every row's token at once: 6 of them, not 12 tokens.
    assert timing['ms_per_position'] == pytest.approx(1e3 * timing['seconds'] / 6)
    assert timing['compile_s'] > 0 and timing['platform'] == 'cpu'
    printed = re.search(r'decoded 12 new tokens in [\d.]+ s: ([\d,.]+) tokens/s', out).group(1)
    assert float(printed.replace(',', '')) == pytest.approx(timing['tokens_per_s'], abs=0.06)


@pytest.mark.parametrize(
    'args, message',
    [
        (['--max_new_tokens', 40], '--max_new_tokens: expected at most 31'),
        (['--prompt_ids', '1,x'], '--prompt_ids: expected comma-separated integers'),
        (['--prompt_ids', '60000', '--max_new_tokens', 4], 'token ids: expected 0..50256, found 60000'),
        (['--num_samples', 0], '--num_samples: expected at least 1'),
        (['--warmup_runs', -1], '--warmup_runs: expected 0 or more, found -1'),
    ],
)
def test_errors_are_one_line(model_files, capsys, args, message):
    root, _ = model_files
    code, _, err = _run(capsys, '--llmc_filepath', root / 'model.bin', *args)
    assert code == 2 and message in err and err.count('\n') == 1


def test_help_in_a_subprocess():
    result = subprocess.run(
        [sys.executable, '-m', 'jaxtrain.generate', '--help'], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0
    for flag in (
        '--checkpoint',
        '--llmc_filepath',
        '--tokenizer_bin',
        '--prompt',
        '--prompt_ids',
        '--num_samples',
        '--max_new_tokens',
        '--temperature',
        '--top_k',
        '--seed',
    ):
        assert flag in result.stdout


def test_unknown_variant_is_one_line(capsys):
    code, _, err = _run(capsys, '--model', 'd13')
    assert code == 2 and "--model: expected one of d12, d24" in err and err.count('\n') == 1


def test_small_vocabulary_without_a_start_token_is_one_line(tmp_path, capsys):
    from trainer_runs import tiny_llmc_model

    model = tiny_llmc_model(tmp_path / 'llama.bin', 'llama3')  # 512 tokens: no LLaMA-3 EOT 128001
    code, _, err = _run(capsys, '--llmc_filepath', model, '--max_new_tokens', 4)
    assert code == 2 and 'the default, EOT 128001, is outside the vocabulary of 512' in err


@pytest.mark.parametrize('kind', ['tokenizer.json', 'tiktoken'])
def test_bpe_tokenizer_encodes_the_prompt_and_decodes_the_sample(tmp_path, capsys, kind):
    import tiktoken
    import tokenizers

    from text_tokenizers import tiktoken_file_from, train_bpe
    from trainer_runs import tiny_llmc_model

    model = tiny_llmc_model(tmp_path / 'model.bin', vocab=512)
    tokenizer = train_bpe(tmp_path / 'tokenizer.json', 'gpt2', vocab_size=512)
    hf = tokenizers.Tokenizer.from_file(str(tokenizer))
    text = 'def main(argv):\n    return'
    if kind == 'tiktoken':
        ranks = tiktoken_file_from(tokenizer, tmp_path / 'tokenizer.model')
        tokenizer = tmp_path / 'tokenizer.model'
        pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
        encoding = tiktoken.Encoding('t', pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        ids, decode = encoding.encode_ordinary(text), encoding.decode
    else:
        ids, decode = hf.encode(text).ids, lambda i: hf.decode(i, skip_special_tokens=False)
    greedy = ['--llmc_filepath', model, '--temperature', 0, '--max_new_tokens', 8]
    code, out, err = _run(capsys, *greedy, '--tokenizer', tokenizer, '--prompt', text)
    assert code == 0, err
    shown = out.split('--- sample 1/1\n')[1].split('\n---\n')[0]
    # The same prompt as ids, decoded by a '<i>' table, gives the ids that the BPE run printed as text.
    pieces = [f'<{i}>'.encode() for i in range(512)]
    header = struct.pack('<256i', *([20240328, 2, 512, 0] + [0] * 252))
    (tmp_path / 'ids.bin').write_bytes(header + b''.join(bytes([len(p)]) + p for p in pieces))
    code, out, err = _run(
        capsys, *greedy, '--tokenizer_bin', tmp_path / 'ids.bin', '--prompt_ids', ','.join(map(str, ids))
    )
    assert code == 0, err
    sampled = [int(i) for i in re.findall(r'<(\d+)>', out.split('--- sample 1/1\n')[1].split('\n---')[0])]
    assert sampled[: len(ids)] == ids and len(sampled) == len(ids) + 8
    assert shown == decode(sampled) and shown.startswith(text)


@pytest.mark.slow
def test_a_checkpoint_decodes_with_its_runs_tokenizer(model_files, tmp_path, capsys):
    from text_tokenizers import train_bpe

    root, params = model_files
    tokenizer = train_bpe(tmp_path / 'tokenizer.json', 'gpt2', vocab_size=512)
    write_checkpoint(
        tmp_path / 'ck', 3, 'gpt2', HEADER, params, training_config={'tokenizer': str(tokenizer)}
    )
    greedy = ['--checkpoint', tmp_path / 'ck', '--temperature', 0, '--max_new_tokens', 6, '--prompt', 'def ']
    code, named, err = _run(capsys, *greedy, '--tokenizer', tokenizer)
    assert code == 0, err
    code, recorded, err = _run(capsys, *greedy)
    assert code == 0, err
    sample = recorded.split('--- sample 1/1\n')[1].split('\n---')[0]
    assert sample == named.split('--- sample 1/1\n')[1].split('\n---')[0] and sample.startswith('def ')
    tokenizer.unlink()  # moved away since: the built-in byte tokenizer decodes instead, no error
    code, fallback, err = _run(capsys, *greedy)
    assert code == 0, err
    note = f'note: the tokenizer the run named, {tokenizer}, is not there; decoding without it'
    assert [line for line in err.splitlines() if note in line and '--tokenizer FILE' in line], err


def _upstream_tree(model: dict) -> dict:
    """InfiniTrain's GPT-2 StateDict as the reference's flat {tree path: array}: Linear weights
    (out, in) transposed to our (in, out) kernels, layers stacked (docs/formats.md, upstream's names)."""
    names = {'ln_1': 'ln_1', 'ln_2': 'ln_2', 'attn.c_attn': 'attn/c_attn', 'attn.c_proj': 'attn/c_proj'}
    names.update({'mlp.c_fc': 'mlp/c_fc', 'mlp.c_proj': 'mlp/c_proj'})
    layers = 1 + max(int(n.split('.')[2]) for n in model if n.startswith('transformer.h.'))
    tree = {
        'wte/embedding': model['transformer.wte.weight'],
        'wpe/embedding': model['transformer.wpe.weight'],
    }
    tree.update({'ln_f/scale': model['transformer.ln_f.weight'], 'ln_f/bias': model['transformer.ln_f.bias']})
    for upstream, ours in names.items():
        norm = ours.startswith('ln')
        weight = [model[f'transformer.h.{i}.{upstream}.weight'] for i in range(layers)]
        tree[f'h/{ours}/scale' if norm else f'h/{ours}/kernel'] = np.stack(
            weight if norm else [w.T for w in weight]
        )
        tree[f'h/{ours}/bias'] = np.stack(
            [model[f'transformer.h.{i}.{upstream}.bias'] for i in range(layers)]
        )
    return tree


@needs_samples
def test_infinitrain_steps_and_roots_decode_as_the_reference(tmp_path, capsys):
    """The binary's own HEAD step (head-gpt2), and the same weights laid out as a DDP 2 x TP 2 run's
    rank directories by the test's upstream writer, taken as a root: both decode as the reference.
    So does the PR generation's root (pr-gpt2/a: its newest step's llm.c model.bin, not the
    checkpoint_final/ copy beside it)."""
    from infinitrain_rank_fixtures import write_run

    from llmc_io.infinitrain.statedict import read_state_dict

    step = SAMPLES / 'head-gpt2' / 'a' / 'checkpoint_step_000010'
    model = {n: t.array for n, t in read_state_dict(step / 'model.ckpt').items()}
    tree = _upstream_tree(model)
    tokens = [7, 300]
    for _ in range(5):  # upstream's GPT-2 from an llm.c file has 12 heads (docs/formats.md)
        tokens.append(int(np.argmax(ref.gpt2_logits(tree, 12, np.array([tokens]))[0, -1])))
    write_run(
        tmp_path / 'ranks' / 'checkpoint_step_000010',
        'gpt2',
        model,
        None,
        0,
        step=10,
        consumed=10,
        lr=0.01,
        ddp=2,
        tp=2,
    )
    pr_tree = llmc_io.load_gpt2(str(SAMPLES / 'pr-gpt2' / 'a' / 'checkpoint_step_000020' / 'model.bin'))[1]
    pr_tokens = [7, 300]
    for _ in range(5):
        pr_tokens.append(int(np.argmax(ref.gpt2_logits(pr_tree, 12, np.array([pr_tokens]))[0, -1])))
    sources = [(step, tokens), (tmp_path / 'ranks', tokens), (SAMPLES / 'pr-gpt2' / 'a', pr_tokens)]
    for source, expected in sources:
        code, out, err = _run(
            capsys, '--checkpoint', source, '--prompt_ids', '7,300', '--max_new_tokens', 5, '--temperature', 0
        )
        assert code == 0, err
        assert out.split('--- sample 1/1\n')[1].split('\n')[0] == ' '.join(map(str, expected[2:]))


def test_a_hugging_face_folder_decodes_with_its_own_tokenizer_json(tmp_path):
    """An exported HF folder holds the run's tokenizer.json; generate from the folder takes it when no
    --tokenizer is given, as it takes a checkpoint's recorded one."""
    import argparse

    import tokenizers

    from text_tokenizers import train_bpe

    folder = tmp_path / 'hf_model'
    folder.mkdir()
    train_bpe(folder / 'tokenizer.json', 'gpt2', vocab_size=512)
    args = argparse.Namespace(checkpoint=str(folder), tokenizer='', tokenizer_bin='')
    config = argparse.Namespace(vocab_size=512)
    tokenizer = generate.load_tokenizer(args, 'gpt2', config, record=None)
    text = 'def main(argv):\n    return'
    expected = tokenizers.Tokenizer.from_file(str(folder / 'tokenizer.json')).encode(text).ids
    from jaxtrain.data.default_corpus import encode_prompt

    assert encode_prompt(tokenizer, text) == expected
    bare = argparse.Namespace(checkpoint=str(tmp_path), tokenizer='', tokenizer_bin='')
    assert generate._folder_tokenizer(bare.checkpoint) == ''  # no tokenizer.json there: the built-in one
