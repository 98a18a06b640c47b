"""Text samples during training: llm.c's `--sample_every` and InfiniTrain's `--freq_generate_txt`,
`--text_length` and `--tokenizer_bin`, and `--tokenizer` (a BPE tokenizer.json or tiktoken file).

When: every `sample_every` steps and after the last step (llm.c train_gpt2.py, f1e2ace); else,
as InfiniTrain (example/gpt2/main.cc at b24d92f), every `freq_generate_txt` steps when a
`tokenizer_bin` (or `tokenizer`) is given; else, by default, once after the last step of a run on the built-in
corpus (see sample_interval). What: one sequence of `text_length` tokens (the start token
included, llm.c's genT = 64) that starts from EOT, as llm.c's samples do (InfiniTrain starts
from a fixed prompt), sampled at temperature 1.0 with top-k 40 (train_gpt2.py's values), with
the KV-cache decoder (jaxtrain/models/decode.py), compiled once for the run.

The sampling key is a pure function of the training state's rng (saved in every checkpoint)
and the step: fold_in(fold_in(rng, SAMPLE_STREAM), step). A resumed run therefore prints the
same samples as the uninterrupted run at the same steps, and sampling never advances or
consumes the training rng. Its time is reported on its own line (`sample_s`), never inside
the step time.

Text is decoded with the tokenizer (data/default_corpus.py), or, for a GPT-2 or LLaMA-3
vocabulary without one, with the built-in byte-level tokenizer of the default corpus (a LLaMA-3
sample then starts from <|begin_of_text|>, as the corpus's files do); with neither the sample
prints as token ids.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxtrain.models.decode import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DecodeOptions, Decoder

# Folded into the training rng first, so that the sampling keys are a stream of their own.
SAMPLE_STREAM = 0x5A3D1E
# What a LLaMA-3 run without a tokenizer starts from: InfiniTrain's LLaMA-3 EOT (<|end_of_text|>).
LLAMA3_EOT = 128001
# How the sample line names its start token.
START_NAMES = {50256: 'EOT', LLAMA3_EOT: 'EOT', 128000: '<|begin_of_text|>'}


def sample_interval(config) -> tuple[int, bool]:
    """(every N steps, also after the last step); (0, False): no samples.

    sample_every N > 0: llm.c's, every N steps and after the last. Otherwise InfiniTrain's
    freq_generate_txt when a tokenizer_bin is given. Otherwise, with sample_every -1 (the
    default), a run on the built-in corpus (no input_bin, either family: the built-in tokenizer
    decodes it) prints one sample after its last step, so the default job shows what it writes;
    sample_every 0 turns that off.
    """
    if config.sample_every > 0:
        return config.sample_every, True
    if (config.tokenizer_bin or config.tokenizer) and config.freq_generate_txt > 0:
        return config.freq_generate_txt, False
    if config.sample_every < 0 and not config.input_bin:
        return 0, True
    return 0, False


def sample_key(rng_words, step: int):
    """The key of the sample after `step`, from the state's rng (uint32[2] key data)."""
    if isinstance(rng_words, jax.Array) and not rng_words.is_fully_addressable:
        rng_words = rng_words.addressable_shards[0].data  # replicated: every process holds it whole
    key = jax.random.wrap_key_data(np.asarray(jax.device_get(rng_words), np.uint32))
    return jax.random.fold_in(jax.random.fold_in(key, SAMPLE_STREAM), step)


def _tokenizer(config, model_config):
    from jaxtrain.data.default_corpus import load_run_tokenizer

    return load_run_tokenizer(
        config.tokenizer_bin, config.tokenizer, config.model_family, model_config.vocab_size
    )


class TrainingSampler:
    """Built once per run when samples are asked for (`make_sampler`); `maybe_sample` after each step."""

    def __init__(self, config, graphdef, model_config, every: int, at_last_step: bool, replicated=None):
        self.every, self.at_last_step = every, at_last_step
        self.num_iteration = config.num_iteration
        self.tokenizer = _tokenizer(config, model_config)
        if self.tokenizer is not None:
            self.start_token = self.tokenizer.eot_token
        else:
            self.start_token = 50256 if config.model_family == 'gpt2' else LLAMA3_EOT
        # A BPE tokenizer names its own end of text; the built-in and llm.c's files are known by id.
        named = getattr(self.tokenizer, 'eot_name', None)
        self.start_name = named or START_NAMES.get(self.start_token, f'token {self.start_token}')
        if self.start_token >= model_config.vocab_size:
            raise ValueError(
                f'sample_every: samples start from EOT {self.start_token}, which a vocab_size of '
                f'{model_config.vocab_size} lacks; pass --tokenizer_bin (its EOT is used) or --sample_every 0'
            )
        length = min(config.text_length, model_config.max_seq_len)
        if length < 2:
            raise ValueError(
                f'text_length: expected at least 2 (the start token and one more), found {length}'
            )
        # The decoder's layers as the run's: a scan_layers run compiles one block (CPU's default,
        # where unrolling deep models costs seconds of compile), an unrolled run the fast straight line.
        layers = DecodeOptions(layers='scan' if config.scan_layers else 'unrolled')
        self.decoder = Decoder(
            graphdef,
            model_config,
            batch_size=1,
            length=length,
            top_k=DEFAULT_TOP_K,
            out_sharding=replicated,
            options=layers,
        )

    def due(self, step: int) -> bool:
        every_n = self.every > 0 and step % self.every == 0
        return every_n or (self.at_last_step and step == self.num_iteration)

    def sample(self, params, rng_words, step: int) -> dict:
        """{'tokens', 'text', 'sample_s' (decoding), 'compile_s' (0 after the first)} after `step`."""
        compiled_before = self.decoder.compile_seconds
        began = time.perf_counter()
        tokens, _ = self.decoder.timed(
            params, [self.start_token], sample_key(rng_words, step), DEFAULT_TEMPERATURE
        )
        total = time.perf_counter() - began
        compile_s = self.decoder.compile_seconds - compiled_before
        ids = tokens[0].tolist()
        if self.tokenizer is not None:
            text = self.tokenizer.decode(ids[1:])
        else:
            text = 'token ids ' + ' '.join(map(str, ids[1:]))
        return {'tokens': ids, 'text': text, 'sample_s': total - compile_s, 'compile_s': compile_s}

    def maybe_sample(self, log, step: int, params, rng_words) -> float:
        """Samples when due and logs it; returns the seconds it took (0 when not due)."""
        if not self.due(step):
            return 0.0
        result = self.sample(params, rng_words, step)
        seconds = result['sample_s'] + result['compile_s']
        compiled = f', compile {result["compile_s"]:.2f} s' if result['compile_s'] else ''
        log.info(
            f'step {step:4d}/{self.num_iteration} | sample ({len(result["tokens"])} tokens '
            f'from {self.start_name}, '
            f'{result["sample_s"] * 1e3:.0f} ms{compiled}; not in the step time):'
        )
        log.info('---\n' + result['text'] + '\n---')
        log.record(
            {
                'step': step,
                'sample': result['text'],
                'sample_s': result['sample_s'],
                'sample_compile_s': result['compile_s'],
            }
        )
        return seconds


def make_sampler(config, parts) -> TrainingSampler | None:
    """The run's sampler (parts: train/setup.py's build_trainer), or None when no samples are asked for."""
    every, at_last_step = sample_interval(config)
    if every <= 0 and not at_last_step:
        return None
    setup = parts.setup
    by_default = config.sample_every < 0 and not (config.tokenizer_bin or config.tokenizer)
    if by_default and _tokenizer(config, setup.model_config) is None:
        return None  # the default's sample needs the built-in tokenizer; nothing was asked for explicitly
    return TrainingSampler(config, setup.graphdef, setup.model_config, every, at_last_step, parts.replicated)
