"""Small BPE tokenizers made inside the tests, offline: `tokenizers` trains one on stdlib text,
and a tiktoken BPE file is derived from the same ranks. Nothing is downloaded."""

from __future__ import annotations

import base64
import json
import sysconfig
from pathlib import Path

SPECIALS = {'gpt2': ['<|endoftext|>'], 'llama3': ['<|begin_of_text|>', '<|end_of_text|>']}


def corpus_text(limit: int = 200_000) -> str:
    """A deterministic slice of the stdlib's source: the same 'built-in corpus' text the trainer uses."""
    root = Path(sysconfig.get_paths()['stdlib'])
    text = ''
    for name in ('textwrap.py', 'string.py', 'shlex.py', 'calendar.py', 'difflib.py', 'argparse.py'):
        text += (root / name).read_text(encoding='utf-8') + '\n\n'
    return text[:limit]


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """openai/gpt-2 src/encoder.py bytes_to_unicode, as byte-level BPE vocabularies spell bytes."""
    bs = (
        list(range(ord('!'), ord('~') + 1))
        + list(range(ord('¡'), ord('¬') + 1))
        + list(range(ord('®'), ord('ÿ') + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def train_bpe(path, family: str, vocab_size: int = 600) -> Path:
    """A byte-level BPE (GPT-2 style) with the family's special tokens, saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS[family],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([corpus_text()], trainer)
    tokenizer.save(str(path))
    return Path(path)


def tiktoken_file_from(tokenizer_json, path) -> dict[bytes, int]:
    """The mergeable ranks of `tokenizer_json` (its non-special tokens, in id order, numbered from 0),
    written as a tiktoken BPE file; returns them."""
    spec = json.loads(Path(tokenizer_json).read_text())
    special = {t['content'] for t in spec['added_tokens']}
    to_byte = {c: b for b, c in gpt2_bytes_to_unicode().items()}
    vocab = sorted((i, t) for t, i in spec['model']['vocab'].items() if t not in special)
    ranks = {bytes(to_byte[c] for c in token): rank for rank, (_, token) in enumerate(vocab)}
    lines = [f'{base64.b64encode(piece).decode()} {rank}' for piece, rank in ranks.items()]
    Path(path).write_text('\n'.join(lines) + '\n')
    return ranks
