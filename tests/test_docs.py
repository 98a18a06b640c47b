"""Every command of docs/text.md, docs/dashboards.md and docs/checkpoints.md runs as written (but
those that need what CI lacks, readme_commands.needs), and README's tour, which repeats them, is
not run again.

docs/text.md's run in a directory holding what a reader supplies: book.txt and a GPT-2-style
tokenizer.json, LLaMA-3-style tokenizer.model and fineweb/*.parquet (made here: a BPE trained on
stdlib text, tests/text_tokenizers.py). Then what they wrote is checked: the shards hold the
tokenizer's encode, the sample printed text, the HF folder holds the tokenizer beside
config.json, TensorBoard's event files hold each step. docs/dashboards.md's two runs (the second
resumed) leave each step once in TensorBoard's reading of the event files."""

import importlib.util
import re
import os
import subprocess

import numpy as np
import pytest

from readme_commands import needs, readme_commands
from text_tokenizers import corpus_text, tiktoken_file_from, train_bpe
from trainer_runs import REPO

COMMANDS = readme_commands(REPO / 'docs' / 'text.md')
DASHBOARD_COMMANDS = readme_commands(REPO / 'docs' / 'dashboards.md')
CHECKPOINT_COMMANDS = readme_commands(REPO / 'docs' / 'checkpoints.md')


def _run(command: str, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
    env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS='cpu')
    return subprocess.run(
        ['bash', '-c', command], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow
def test_docs_text_commands_run_as_written(tmp_path):
    import tokenizers
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(COMMANDS) == 7 and [needs(c) is None for c in COMMANDS].count(False) == 1  # GPT-2 124M's
    (tmp_path / 'configs').symlink_to(REPO / 'configs')
    text = corpus_text(60_000)
    (tmp_path / 'book.txt').write_text(text)
    train_bpe(tmp_path / 'tokenizer.json', 'gpt2')
    tiktoken_file_from(train_bpe(tmp_path / 'llama3.json', 'llama3'), tmp_path / 'tokenizer.model')
    has_pyarrow = importlib.util.find_spec('pyarrow') is not None
    if has_pyarrow:
        import pyarrow as pa
        import pyarrow.parquet as pq

        (tmp_path / 'fineweb').mkdir()
        pq.write_table(
            pa.table({'text': [text[i : i + 2000] for i in range(0, len(text), 2000)] * 4}),
            tmp_path / 'fineweb' / 'part_0000.parquet',
        )
    for command in COMMANDS:
        if needs(command) or ('parquet' in command.text and not has_pyarrow):
            continue
        result = _run(command.text, tmp_path)
        assert result.returncode == 0, (
            f'docs/text.md line {command.line}: {command.text}\n{result.stderr[-3000:]}'
        )
        if 'jaxtrain.main' in command.text:
            assert '| sample (16 tokens from ' in result.stdout + result.stderr

    hf = tokenizers.Tokenizer.from_file(str(tmp_path / 'tokenizer.json'))
    hf.encode_special_tokens = True
    sections = text.split('\n\n')
    expected = [
        t
        for i, s in enumerate(sections)
        for t in [0] + hf.encode(s + '\n\n' if i != len(sections) - 1 else s).ids
    ]
    shards = sorted((tmp_path / 'data').glob('book_val_*.bin')) + sorted(
        (tmp_path / 'data').glob('book_train_*.bin')
    )
    found = np.concatenate([np.fromfile(p, '<u2', offset=1024) for p in shards]).tolist()
    assert found == expected and len(np.fromfile(shards[0], '<u2', offset=1024)) == 2000
    assert (tmp_path / 'data' / 'book_tokenizer.bin').read_bytes()[:4] == (20240328).to_bytes(4, 'little')
    assert sorted(p.name for p in (tmp_path / 'hf_model').iterdir()) == [
        'config.json',
        'generation_config.json',
        'model.safetensors',
        'tokenizer.json',
        'tokenizer_config.json',
    ]
    events = EventAccumulator(str(tmp_path / 'tb'))
    events.Reload()
    assert [e.step for e in events.Scalars('train/loss')] == [1, 2, 3, 4]
    # --input_val_bin alone validates (val_loss_every derived): at the run's last step
    assert [e.step for e in events.Scalars('val/loss')] == [4]
    assert (tmp_path / 'hf_model' / 'tokenizer.json').read_bytes() == (
        tmp_path / 'tokenizer.json'
    ).read_bytes()


@pytest.mark.slow
def test_docs_dashboards_commands_run_as_written(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(DASHBOARD_COMMANDS) == 2
    (tmp_path / 'configs').symlink_to(REPO / 'configs')
    for command in DASHBOARD_COMMANDS:
        result = _run(command.text, tmp_path)
        assert result.returncode == 0, (
            f'docs/dashboards.md line {command.line}: {command.text}\n{result.stderr[-3000:]}'
        )
    events = EventAccumulator(str(tmp_path / 'tb'))
    events.Reload()
    assert [e.step for e in events.Scalars('train/loss')] == list(range(1, 10))
    assert [e.step for e in events.Scalars('val/loss')] == [3, 6, 9]
    assert [e.step for e in events.Scalars('checkpoint/restore_s')] == [6]


@pytest.mark.slow
def test_docs_checkpoints_commands_run_as_written(tmp_path):
    assert len(CHECKPOINT_COMMANDS) == 3
    (tmp_path / 'configs').symlink_to(REPO / 'configs')
    outputs = []
    for command in CHECKPOINT_COMMANDS:
        result = _run(command.text, tmp_path)
        assert result.returncode == 0, f'line {command.line}: {command.text}\n{result.stderr[-3000:]}'
        outputs.append(result.stdout + result.stderr)
    assert outputs[1].count('best (val ') == 2
    assert 'weights only (--init_from' in outputs[2] and 'step    1/4' in outputs[2]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return {
        re.sub(r'[^\w\- ]', '', line.lstrip('#').strip().lower()).replace(' ', '-')
        for line in markdown.splitlines()
        if line.startswith('#')
    }


def test_every_relative_link_of_readme_and_docs_resolves():
    """README moved its depth into docs/: a link to a moved file or section must follow it."""
    broken = []
    for page in [REPO / 'README.md', *sorted((REPO / 'docs').glob('*.md'))]:
        for target in re.findall(r'\]\(([^)\s]+)\)', page.read_text()):
            if re.match(r'[a-z]+:', target):
                continue
            path, _, anchor = target.partition('#')
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f'{page.name}: {target} (no such file)')
            elif anchor and file.suffix == '.md' and anchor not in _anchors(file.read_text()):
                broken.append(f'{page.name}: {target} (no such heading)')
    assert not broken, broken


def test_every_repository_path_readme_and_docs_name_exists():
    """Modules move (a refactor, a split): a page naming the old path would send a reader nowhere.
    docs/benchmark-history.md is left out: it names the scripts of its time on purpose."""
    pages = [REPO / 'README.md', REPO / 'CONTRIBUTING.md', *sorted((REPO / 'docs').glob('*.md'))]
    pattern = r'\b((?:jaxtrain|llmc_io|tests|bench|launch|configs)/[\w/.-]+\.(?:py|sh|sbatch|md))'
    missing = [
        f'{page.name}: {path}'
        for page in pages
        if page.name != 'benchmark-history.md'
        for path in sorted(set(re.findall(pattern, page.read_text())))
        if not (REPO / path).exists()
    ]
    assert not missing, missing
