"""The train and validation streams of one run: which shards, at the run's batch geometry."""

from jaxtrain.data.stream import LLMCShuffledStream
from jaxtrain.data.stream import TokenStream


def _print_on_process_0(line: str) -> None:
    import jax

    if jax.process_index() == 0:
        print(line, flush=True)


def data_paths(config) -> tuple[str, str]:
    """(train glob, val glob): the run's --input_bin, else the built-in corpus."""
    if config.input_bin:
        return config.input_bin, config.input_val_bin
    from jaxtrain.data.default_corpus import ensure_default_corpus

    # The built-in corpus, in the family's shards (the same bytes as the same ids for both).
    train_path, val_path = ensure_default_corpus(report=_print_on_process_0, family=config.model_family)
    return train_path, config.input_val_bin or val_path


def train_stream(config, geometry, vocab_size: int, pattern: str) -> TokenStream:
    """The train stream, in order or (--shuffle llmc) in llm.c's permuted order."""
    common = dict(name='train', model_family=config.model_family)
    if config.get('shuffle', 'none') == 'llmc':
        return LLMCShuffledStream(
            pattern,
            geometry.tokens_per_step,
            config.sequence_length,
            vocab_size,
            accumulation=geometry.accumulation,
            **common,
        )
    return TokenStream(pattern, geometry.tokens_per_step, config.sequence_length, vocab_size, **common)


def open_run_streams(config, geometry, vocab_size: int):
    """(train stream, val stream or None): a step reads one window of tokens_per_step."""
    train_pattern, val_pattern = data_paths(config)
    stream = train_stream(config, geometry, vocab_size, train_pattern)
    val_stream = None
    if config.val_loss_every > 0 and val_pattern:
        val_stream = TokenStream(
            val_pattern,
            geometry.rows_per_micro_step * config.sequence_length,
            config.sequence_length,
            vocab_size,
            name='val',
            model_family=config.model_family,
        )
        if config.val_max_steps > val_stream.windows_per_epoch:
            raise ValueError(
                f'val_max_steps: expected at most the {val_stream.windows_per_epoch} batches '
                f'{val_pattern} holds at this batch geometry, found {config.val_max_steps}'
            )
    return stream, val_stream
