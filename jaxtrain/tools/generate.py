"""`python -m jaxtrain.generate`: sample text from a checkpoint or an llm.c model file.

    python -m jaxtrain.generate --checkpoint RUN/checkpoint_step_000100 --prompt "def "
    python -m jaxtrain.generate --checkpoint RUN   # the newest step, Orbax, InfiniTrain or llm.c's
    python -m jaxtrain.generate --checkpoint LORA_RUN [--base gpt2_124M.bin]   # adapters on their base
    python -m jaxtrain.generate --llmc_filepath gpt2_124M.bin --tokenizer_bin gpt2_tokenizer.bin \\
        --prompt "The meaning of life is" --num_samples 4 --max_new_tokens 64
    python -m jaxtrain.generate --model d12 --dtype bfloat16 --num_samples 16   # timing only

Decoding runs with a KV cache, compiled once; the tokens/s printed
counts new tokens of all samples over the decoding time, compilation excluded. Text is encoded
and decoded with --tokenizer (a Hugging Face tokenizer.json or a tiktoken BPE file, by its own
library), or --tokenizer_bin (an llm.c tokenizer file: decoding, and --prompt by longest match),
or, for a GPT-2 or LLaMA-3 vocabulary without either, the built-in byte-level tokenizer of the
default corpus. Errors are one line, exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from jaxtrain.tools.command_line import program_name, reader_gone
from jaxtrain.config.flags import quiet_absl

EXIT_ERROR = 2
PROG = 'python -m jaxtrain.generate'


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name(PROG), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        '--checkpoint',
        metavar='DIR',
        help='a checkpoint step of any kind --init_from reads (Orbax, InfiniTrain, an llm.c run folder, '
        'a Hugging Face folder), or a checkpoint root (its newest committed step of any kind)',
    )
    source.add_argument('--llmc_filepath', metavar='FILE', help='an llm.c GPT-2 or LLaMA-3 model file')
    source.add_argument(
        '--model',
        metavar='VARIANT',
        help='a named variant of --model_family with random weights, for timing decoding (e.g. d12)',
    )
    parser.add_argument(
        '--model_family', choices=('gpt2', 'llama3'), default='gpt2', help='the family of --model (gpt2)'
    )
    parser.add_argument(
        '--base',
        default='',
        metavar='FILE',
        help="a LoRA --checkpoint's base llm.c file, where it is now ('' = the path its trainer state "
        'records, or the random init of its recorded seed; either is checked against the recorded sha256)',
    )
    parser.add_argument(
        '--tokenizer_bin',
        default='',
        metavar='FILE',
        help="llm.c tokenizer file to decode (and encode --prompt) with ('' = the built-in byte-level "
        'tokenizer of a GPT-2 or LLaMA-3 vocabulary; token ids for any other)',
    )
    parser.add_argument(
        '--tokenizer',
        default='',
        metavar='FILE',
        help="a Hugging Face tokenizer.json or tiktoken BPE file (LLaMA-3's tokenizer.model) to encode "
        "--prompt and decode with ('' = a --checkpoint's run's --tokenizer or a Hugging Face folder's "
        "tokenizer.json, else --tokenizer_bin's or the built-in)",
    )
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument(
        '--prompt',
        default=None,
        help="text to continue: --tokenizer's BPE encoding, or the longest match over --tokenizer_bin's "
        'pieces (default: EOT)',
    )
    prompt.add_argument(
        '--prompt_ids', default=None, help="comma-separated token ids to continue, e.g. '464,3616'"
    )
    parser.add_argument(
        '--num_samples', type=int, default=1, help='samples, decoded together as one batch (1)'
    )
    parser.add_argument('--max_new_tokens', type=int, default=64, help='tokens to generate per sample (64)')
    parser.add_argument(
        '--temperature', type=float, default=1.0, help="softmax temperature; 0 = greedy (1.0, llm.c's)"
    )
    parser.add_argument(
        '--top_k',
        type=int,
        default=40,
        help="sample from the k likeliest tokens; 0 = all (40, llm.c's train_gpt2.py)",
    )
    parser.add_argument('--seed', type=int, default=1337, help="sampling seed (1337, llm.c's sample rng)")
    parser.add_argument(
        '--dtype', choices=('float32', 'bfloat16'), default='float32', help='compute dtype (float32)'
    )
    parser.add_argument(
        '--warmup_runs',
        type=int,
        default=0,
        help='decode this many times first, untimed (the first run also sets up CUDA graphs) (0)',
    )
    parser.add_argument(
        '--json',
        default='',
        metavar='FILE',
        help="write the timing (tokens/s, seconds, compile seconds, batch, ...) to FILE as JSON ('' = none)",
    )
    parser.add_argument('--verbose', action='store_true', help='print a traceback with errors')
    return parser


def _model_config(weights):
    """The family's config dataclass from the fields the checkpoint records (an llm.c header's
    fields too: those the config has)."""
    from jaxtrain.models import FAMILIES

    if weights.family not in FAMILIES:
        raise ValueError(f"{weights.what}: model_family: expected gpt2 or llama3, found {weights.family!r}")
    if weights.model_config is None:
        raise ValueError(
            f'{weights.what}: model shape: expected a record of it (jaxtrain\'s) or an llm.c model.bin, '
            "found neither (a CKPT file has no head count or RoPE settings, and HEAD's trainer_state.json "
            'holds config defaults); resume it with its --llmc_filepath and save again'
        )
    config_cls = FAMILIES[weights.family][1]
    return config_cls(
        **{k: v for k, v in weights.model_config.items() if k in config_cls.__dataclass_fields__}
    )


def load_model(args):
    """(family, model config, graphdef, params as a pure dict of jnp arrays, description, the
    checkpoint's trainer-state record or None)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxtrain.models import FAMILIES

    record = None
    if args.model:
        family = args.model_family
        model_cls, _, variants = FAMILIES[family]
        if args.model not in variants:
            raise ValueError(f"--model: expected one of {', '.join(sorted(variants))}, found {args.model!r}")
        config = variants[args.model]
        init = jax.jit(lambda: nnx.split(model_cls(config, rngs=nnx.Rngs(args.seed)), nnx.Param)[1])
        params = nnx.to_pure_dict(init())
        where = f'random init of {args.model} (seed {args.seed})'
    else:  # any checkpoint --init_from reads, LoRA adapters folded into their base
        from jaxtrain.checkpoint.resume import read_weights

        with quiet_absl(not args.verbose):  # Orbax's warnings that are normal for these checkpoints
            flag = '--checkpoint' if args.checkpoint else '--llmc_filepath'
            weights = read_weights(args.checkpoint or args.llmc_filepath, flag, lora_base=args.base)
        family, config, params, where = weights.family, _model_config(weights), weights.params, weights.what
        record = weights.record
    model_cls = FAMILIES[family][0]
    dtype = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}[args.dtype]
    abstract = nnx.eval_shape(lambda: model_cls(config, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, abstract_params = nnx.split(abstract, nnx.Param)
    from jaxtrain.checkpoint.resume import pad_vocabulary_rows

    params = pad_vocabulary_rows(params, nnx.to_pure_dict(abstract_params))  # V rows of wte, Vp wanted
    expected = jax.tree.map(lambda a: tuple(a.shape), nnx.to_pure_dict(abstract_params))
    found = jax.tree.map(lambda a: tuple(a.shape), params)
    if expected != found:
        raise ValueError(f'{where}: tensors do not fit the {family} model its config describes')
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    return family, config, graphdef, params, where, record


def _run_tokenizer(record) -> str:
    """The BPE tokenizer the checkpoint's run named (--tokenizer), where that file still is; else ''."""
    named = ((record or {}).get('training_config') or {}).get('tokenizer', '')
    if named and not Path(named).is_file():
        # Decoding goes on without it, so the text printed is not the run's: say so, once.
        print(
            f'{program_name(PROG)}: note: the tokenizer the run named, {named}, is not there; decoding '
            'without it (pass --tokenizer FILE to decode as the run did)',
            file=sys.stderr,
        )
        return ''
    return named


def load_tokenizer(args, family: str, config, record=None):
    """The tokenizer to decode with, or None (ids are printed) when there is none to take. When none
    is given: the checkpoint's run's own --tokenizer (its record's), else a Hugging Face folder's
    tokenizer.json."""
    from jaxtrain.data.default_corpus import load_run_tokenizer

    tokenizer = args.tokenizer
    if not tokenizer and not args.tokenizer_bin:
        tokenizer = _run_tokenizer(record) or _folder_tokenizer(args.checkpoint)
    return load_run_tokenizer(args.tokenizer_bin, tokenizer, family, config.vocab_size)


def _folder_tokenizer(checkpoint) -> str:
    """A Hugging Face folder's own tokenizer.json (`ckpt export --format hf` writes the run's there),
    so that generating from the folder decodes as its run did; else ''."""
    found = Path(checkpoint or '') / 'tokenizer.json' if checkpoint else None
    return str(found) if found is not None and found.is_file() else ''


def prompt_ids(args, tokenizer, eot_default: int, vocab_size: int) -> list[int]:
    if args.prompt_ids is not None:
        try:
            return [int(piece) for piece in args.prompt_ids.replace(' ', '').split(',') if piece]
        except ValueError:
            raise ValueError(
                f'--prompt_ids: expected comma-separated integers, found {args.prompt_ids!r}'
            ) from None
    if args.prompt is not None:
        if tokenizer is None:
            raise ValueError(
                '--prompt: expected a --tokenizer or --tokenizer_bin to encode it with, found none; use '
                '--prompt_ids'
            )
        from jaxtrain.data.default_corpus import encode_prompt

        return encode_prompt(tokenizer, args.prompt)
    start = tokenizer.eot_token if tokenizer is not None else eot_default
    if start >= vocab_size:
        raise ValueError(
            f'--prompt_ids: expected ids to start from (the default, EOT {start}, is outside the '
            f'vocabulary of {vocab_size}), found none; pass --prompt_ids or a --tokenizer_bin (its EOT)'
        )
    return [start]


def _check_args(args) -> None:
    for name in ('num_samples', 'max_new_tokens'):
        if getattr(args, name) < 1:
            raise ValueError(f'--{name}: expected at least 1, found {getattr(args, name)}')
    if args.warmup_runs < 0:
        raise ValueError(f'--warmup_runs: expected 0 or more, found {args.warmup_runs}')
    if args.top_k < 0:
        raise ValueError(f'--top_k: expected 0 (all) or more, found {args.top_k}')


@functools.lru_cache(maxsize=4)
def _decoder(graphdef, config, batch_size: int, length: int, top_k: int):
    """One compiled decoder per model and shape in a process: a second checkpoint of the same
    model, decoded by the same process, is not compiled again."""
    from jaxtrain.models.decode import Decoder

    return Decoder(graphdef, config, batch_size=batch_size, length=length, top_k=top_k)


def run(args) -> int:
    _check_args(args)
    import jax

    family, config, graphdef, params, where, record = load_model(args)
    tokenizer = load_tokenizer(args, family, config, record)
    # Files without a tokenizer start from the family's usual EOT (GPT-2 50256, LLaMA-3 <|eot_id|>).
    prompt = prompt_ids(args, tokenizer, 50256 if family == 'gpt2' else 128001, config.vocab_size)
    length = len(prompt) + args.max_new_tokens
    if length > config.max_seq_len:
        raise ValueError(
            f'--max_new_tokens: expected at most {config.max_seq_len - len(prompt)} (max_seq_len '
            f'{config.max_seq_len} less the {len(prompt)} prompt tokens), found {args.max_new_tokens}'
        )
    decoder = _decoder(graphdef, config, args.num_samples, length, args.top_k)
    for _ in range(args.warmup_runs):
        decoder.timed(params, prompt, jax.random.key(args.seed), args.temperature)
    tokens, seconds = decoder.timed(params, prompt, jax.random.key(args.seed), args.temperature)
    compile_seconds = decoder.compile_seconds
    print(f'{family} from {where}; prompt {len(prompt)} tokens; {args.max_new_tokens} new tokens per sample')
    for row, sample in enumerate(tokens):
        print(f'--- sample {row + 1}/{len(tokens)}')
        new = sample[len(prompt) :]
        shown = tokenizer.decode(sample) if tokenizer is not None else ' '.join(map(str, new.tolist()))
        print(shown)
    new_tokens = args.num_samples * args.max_new_tokens
    print('---')
    print(
        f'decoded {new_tokens} new tokens in {seconds:.3f} s: {new_tokens / seconds:,.1f} tokens/s '
        f'(batch {args.num_samples}; compile {compile_seconds:.1f} s; {jax.devices()[0].platform})'
    )
    if args.json:
        timing = {
            'family': family,
            'batch': args.num_samples,
            'new_tokens': new_tokens,
            'seconds': seconds,
            'tokens_per_s': new_tokens / seconds,
            'ms_per_position': 1e3 * seconds / args.max_new_tokens,  # a loop step, all rows
            'compile_s': compile_seconds,
            'warmup_runs': args.warmup_runs,
            'dtype': args.dtype,
            'platform': jax.devices()[0].platform,
        }
        Path(args.json).write_text(json.dumps(timing) + '\n')
    return 0


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)  # inside: --help's text goes to a pipe too
        return run(args)
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return 130
    except BrokenPipeError:  # `| head` has read what it wanted
        return reader_gone()
    except Exception as e:  # noqa: BLE001  one line for people; the traceback on request
        if args.verbose:
            raise
        text = str(e).strip()
        message = text.splitlines()[0] if text else type(e).__name__
        print(f'{program_name(PROG)}: error: {message}', file=sys.stderr)
        return EXIT_ERROR
