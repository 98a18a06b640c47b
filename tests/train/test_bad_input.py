"""Bad input through the trainer's command line, one test per case.

Every case must end with: an exit status other than 0; exactly one line on stderr,
`error: ...`, naming the file or key, what was expected and what was found, and what to
do; no traceback (that needs --verbose); and nothing on disk changed (the digest of every
input file and checkpoint is the same before and after). The llmc_io-level messages have
their own tests (test_llmc_*.py); these check what a user of the trainer sees.

"""

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from cli_runs import run_cli, tree_digest
from jaxtrain.checkpoint.trainer_state import with_digest
from trainer_runs import random_shard, tiny_llmc_model, write_shard

HEADER_BYTES = 1024
GPT2, LLAMA3 = 'configs/gpt2.py', 'configs/llama3.py'


@dataclasses.dataclass(frozen=True)
class Files:
    root: Path
    gpt2_model: str  # vocab 512, max_seq_len 128
    llama3_model: str
    gpt2_shard: str
    llama3_shard: str
    other_model: str  # a GPT-2 model of vocabulary 256: does not fit the checkpoints
    checkpoints: Path  # a run's checkpoint_dir holding steps 1 and 2

    def step(self, step: int) -> Path:
        return self.checkpoints / f'checkpoint_step_{step:06d}'

    def gpt2(self, *args):
        """A command line that would train the tiny GPT-2, plus `args` (later flags win).
        Learning rate 1e-3 as in test_checkpointing.py: the same compiled program."""
        files = ['--llmc_filepath', self.gpt2_model, '--input_bin', self.gpt2_shard]
        return [*files, '--learning_rate', 1e-3, *args]

    def llama3(self, *args):
        return ['--llmc_filepath', self.llama3_model, '--input_bin', self.llama3_shard, *args]


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('bad_input')
    made = Files(
        root=root,
        gpt2_model=tiny_llmc_model(root / 'gpt2.bin'),
        llama3_model=tiny_llmc_model(root / 'llama3.bin', family='llama3'),
        gpt2_shard=random_shard(root / 'gpt2_train.bin', num_tokens=4_000),
        llama3_shard=random_shard(root / 'llama3_train.bin', num_tokens=4_000, kind='llama3'),
        other_model=tiny_llmc_model(root / 'vocab256.bin', vocab=256),
        checkpoints=root / 'ck',
    )
    run = run_cli(*made.gpt2('--num_iteration', 2, '--save_steps', 1, '--checkpoint_dir', made.checkpoints))
    assert run.code == 0, run.err
    return made


# --- making bad files (copies; the fixture's files stay good) ------------------------


def _copy(src, tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copyfile(src, dst)
    return dst


def header_edited(src, tmp_path, name, slots: dict) -> str:
    """A copy with int32 header slots replaced."""
    path = _copy(src, tmp_path, name)
    header = np.fromfile(path, '<i4', count=256)
    for index, value in slots.items():
        header[index] = value
    with open(path, 'r+b') as f:
        f.write(header.tobytes())
    return str(path)


def resized(src, tmp_path, name, delta: int) -> str:
    """A copy `delta` bytes longer (zeros appended) or shorter (cut off the end)."""
    path = _copy(src, tmp_path, name)
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(size + delta)
    return str(path)


def with_nan(src, tmp_path, name, value_index: int = 5) -> str:
    """A copy with one fp32 weight (the `value_index`-th after the header) set to NaN."""
    path = _copy(src, tmp_path, name)
    with open(path, 'r+b') as f:
        f.seek(HEADER_BYTES + 4 * value_index)
        f.write(np.float32(np.nan).tobytes())
    return str(path)


def float_slots_truncated(src, tmp_path, name) -> str:
    """What llm.c master's write_model makes of the LLaMA-3 header floats: int(1.0) = 1,
    int(1e-5) = 0, int(10000.0) = 10000 in slots 8, 10, 11 (llmc_io/llama3.py)."""
    return header_edited(src, tmp_path, name, {8: 1, 10: 0, 11: 10000})


def step_copy(files: Files, tmp_path: Path, step: int = 2) -> Path:
    step_dir = tmp_path / 'damaged' / f'checkpoint_step_{step:06d}'
    shutil.copytree(files.step(step), step_dir)
    return step_dir


def trainer_state_edited(files, tmp_path, edit: Callable[[dict], None]) -> Path:
    step_dir = step_copy(files, tmp_path)
    path = step_dir / 'trainer_state' / 'metadata'
    state = json.loads(path.read_text())
    edit(state)
    # With its digest made to fit: these cases test the field checks behind the digest's
    # (an edit that leaves the digest as it was: test_record_identity.py).
    path.write_text(json.dumps(with_digest(state)))
    return step_dir


def trainer_state_cut(files, tmp_path) -> Path:
    step_dir = step_copy(files, tmp_path)
    (step_dir / 'trainer_state' / 'metadata').write_text('{"step": 2, "data_posit')
    return step_dir


def without(files, tmp_path, item: str) -> Path:
    step_dir = step_copy(files, tmp_path)
    shutil.rmtree(step_dir / item)
    return step_dir


def tensor_file_truncated(files, tmp_path) -> Path:
    """The largest data file of the params item cut to half its size."""
    step_dir = step_copy(files, tmp_path)
    data = max((p for p in (step_dir / 'params').rglob('*') if p.is_file()), key=lambda p: p.stat().st_size)
    with open(data, 'r+b') as f:
        f.truncate(data.stat().st_size // 2)
    return step_dir


def checksum_changed(state):
    name = min(state['checksums']['params'])
    state['checksums']['params'][name] = '00000000:00000000'


def unfinished_save(files, tmp_path) -> Path:
    """What a killed save leaves: Orbax's temporary name, never renamed."""
    step_dir = tmp_path / 'checkpoint_step_000003.orbax-checkpoint-tmp-1234'
    shutil.copytree(files.step(2), step_dir)
    return step_dir


def plain_directory(tmp_path) -> Path:
    (tmp_path / 'notes').mkdir()
    (tmp_path / 'notes' / 'readme.txt').write_text('not a checkpoint')
    return tmp_path / 'notes'


# --- the corpus ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    command: Callable[[Files, Path], list]  # builds the bad input under tmp_path; returns the flags
    expected: tuple[str, ...]  # what the error line must hold: the file or key, expected, found, what to do
    config: str = GPT2


CASES = {
    # llm.c model files (--llmc_filepath)
    'model: wrong magic': Case(
        lambda f, t: f.gpt2('--llmc_filepath', header_edited(f.gpt2_model, t, 'magic.bin', {0: 12345})),
        ('magic.bin', 'header[0] magic', 'expected 20240326 (GPT-2 model file)', 'found 12345'),
    ),
    'model: a token shard given as the model': Case(
        lambda f, t: f.gpt2('--llmc_filepath', f.gpt2_shard),
        ('gpt2_train.bin', 'header[0] magic', 'found 20240520 (GPT-2 token shard)'),
    ),
    'model: unknown version': Case(
        lambda f, t: f.gpt2('--llmc_filepath', header_edited(f.gpt2_model, t, 'v7.bin', {1: 7})),
        ('v7.bin', 'header[1] version', 'expected 3 (fp32) or 5 (bf16)', 'found 7', 'not a version llm.c'),
    ),
    'model: truncated': Case(
        lambda f, t: f.gpt2('--llmc_filepath', resized(f.gpt2_model, t, 'cut.bin', -100)),
        ('cut.bin', 'file size', 'found 184,732', '100 bytes short'),
    ),
    'model: shorter than its header': Case(
        lambda f, t: f.gpt2('--llmc_filepath', resized(f.gpt2_model, t, 'stub.bin', -184_000)),
        ('stub.bin', 'file size', 'at least 1,024 bytes', 'found 832', 'truncated or not an llm.c file'),
    ),
    'model: header says more layers than the file holds': Case(
        lambda f, t: f.gpt2('--llmc_filepath', header_edited(f.gpt2_model, t, 'layers.bin', {4: 3})),
        ('layers.bin', 'file size', 'bytes short', 'the header is wrong'),
    ),
    'model: bytes after the last tensor': Case(
        lambda f, t: f.gpt2('--llmc_filepath', resized(f.gpt2_model, t, 'long.bin', 64)),
        ('long.bin', 'file size', '64 bytes more than the header accounts for'),
    ),
    'model: vocab_size above padded_vocab_size': Case(
        lambda f, t: f.gpt2('--llmc_filepath', header_edited(f.gpt2_model, t, 'vp.bin', {3: 600})),
        ('vp.bin', 'padded_vocab_size', 'expected >= vocab_size (600)', 'found 512'),
    ),
    'model: NaN weight': Case(
        lambda f, t: f.gpt2('--llmc_filepath', with_nan(f.gpt2_model, t, 'nan.bin')),
        ('nan.bin', 'tensor wte', 'expected finite values', 'found 1 NaN', 'use an earlier checkpoint'),
    ),
    'model: missing file': Case(
        lambda f, t: f.gpt2('--llmc_filepath', t / 'nowhere.bin'),
        ('nowhere.bin', 'expected an existing file', 'found nothing at that path'),
    ),
    'model: LLaMA-3 header floats truncated to integers': Case(
        lambda f, t: f.llama3('--llmc_filepath', float_slots_truncated(f.llama3_model, t, 'master.bin')),
        (
            'master.bin',
            'float fields',
            'expected fp32 bit patterns',
            'found integers',
            '--config.llmc_norm_eps',
        ),
        config=LLAMA3,
    ),
    'model: a GPT-2 file given to the LLaMA-3 config': Case(
        lambda f, t: f.llama3('--llmc_filepath', f.gpt2_model),
        ('gpt2.bin', 'expected 20240803 (LLaMA-3 model file)', 'found 20240326', '--config=configs/gpt2.py'),
        config=LLAMA3,
    ),
    'model: a LLaMA-3 file given to the GPT-2 config': Case(
        lambda f, t: f.gpt2('--llmc_filepath', f.llama3_model),
        (
            'llama3.bin',
            'expected 20240326 (GPT-2 model file)',
            'found 20240803',
            '--config=configs/llama3.py',
        ),
    ),
    'model: sequence_length beyond max_seq_len': Case(
        lambda f, t: f.gpt2('--sequence_length', 256, '--total_batch_size', 1024),
        ('sequence_length', 'expected at most the model max_seq_len 128', 'found 256'),
    ),
    # token shards (--input_bin)
    'shard: a model file given as data': Case(
        lambda f, t: f.gpt2('--input_bin', f.gpt2_model),
        ('gpt2.bin', 'header[0] magic', 'found 20240326 (GPT-2 model file)', 'not a token shard'),
    ),
    'shard: wrong magic': Case(
        lambda f, t: f.gpt2('--input_bin', header_edited(f.gpt2_shard, t, 'magic.bin', {0: 7})),
        ('magic.bin', 'header[0] magic', 'expected 20240520 (GPT-2 token shard)', 'found 7'),
    ),
    'shard: wrong version': Case(
        lambda f, t: f.gpt2('--input_bin', header_edited(f.gpt2_shard, t, 'v2.bin', {1: 2})),
        ('v2.bin', 'header[1] version', 'expected 1 for a gpt2 shard', 'found 2'),
    ),
    'shard: shorter than its header says': Case(
        lambda f, t: f.gpt2('--input_bin', resized(f.gpt2_shard, t, 'cut.bin', -10)),
        ('cut.bin', 'file size', 'expected 9,024 bytes', 'found 9,014', 'bytes short'),
    ),
    'shard: empty': Case(
        lambda f, t: f.gpt2('--input_bin', header_edited(f.gpt2_shard, t, 'empty.bin', {2: 0})),
        ('empty.bin', 'header[2] ntok', 'expected at least 1 token', 'found 0', 'leave it out of the glob'),
    ),
    'shard: too short for one batch': Case(
        lambda f, t: f.gpt2('--input_bin', write_shard(t / 'short.bin', np.arange(100))),
        ('short.bin', 'expected at least tokens_per_step + 1 = 257', 'found 100', 'use a smaller batch'),
    ),
    'shard: token id beyond the vocabulary': Case(
        lambda f, t: f.gpt2('--input_bin', write_shard(t / 'ids.bin', np.arange(1000) % 600)),
        (
            'ids.bin',
            'token at offset 512',
            'expected id < vocab_size 512',
            'found 512',
            'different vocabulary',
        ),
    ),
    'shard: a glob that matches nothing': Case(
        lambda f, t: f.gpt2('--input_bin', t / 'fineweb_train_*.bin'),
        ('fineweb_train_*.bin', 'matched no files', 'check the path'),
    ),
    'shard: GPT-2 and LLaMA-3 shards in one glob': Case(
        lambda f, t: f.gpt2(
            '--input_bin',
            (_copy(f.gpt2_shard, t, 'mix_a.bin'), _copy(f.llama3_shard, t, 'mix_b.bin'))[0].parent
            / 'mix_*.bin',
        ),
        ('mix_b.bin', 'token dtype', 'expected uint16', 'found uint32', 'do not mix'),
    ),
    'shard: LLaMA-3 shards for a GPT-2 model': Case(
        lambda f, t: f.gpt2('--input_bin', f.llama3_shard, '--num_iteration', 1),
        ('llama3_train.bin', 'expected a gpt2 shard', 'found a llama3 shard', '--config=configs/llama3.py'),
    ),
    'shard: too few validation batches': Case(
        lambda f, t: f.gpt2('--input_val_bin', f.gpt2_shard, '--val_loss_every', 1, '--val_max_steps', 100),
        ('val_max_steps', 'expected at most the 15 batches', 'found 100'),
    ),
    # checkpoints (--resume_from)
    'checkpoint: a step that is not there': Case(
        lambda f, t: f.gpt2('--resume_from', f.step(99)),
        (
            'checkpoint_step_000099',
            'found nothing there',
            'holds checkpoint_step_000001, checkpoint_step_000002',
            '--resume_from latest',
        ),
    ),
    'checkpoint: params item missing': Case(
        lambda f, t: f.gpt2('--resume_from', without(f, t, 'params')),
        ('damaged/checkpoint_step_000002', 'params', 'earlier step'),
    ),
    'checkpoint: opt_state item missing though saved': Case(
        lambda f, t: f.gpt2('--resume_from', without(f, t, 'opt_state')),
        ('damaged/checkpoint_step_000002', 'opt_state', 'has_optimizer_state', 'earlier step'),
    ),
    'checkpoint: trainer_state item missing': Case(
        lambda f, t: f.gpt2('--resume_from', without(f, t, 'trainer_state')),
        (
            'damaged/checkpoint_step_000002',
            'expected a committed checkpoint',
            'found no trainer_state/metadata',
            'Pick an earlier step',
        ),
    ),
    'checkpoint: truncated tensor file': Case(
        lambda f, t: f.gpt2('--resume_from', tensor_file_truncated(f, t)),
        ('damaged/checkpoint_step_000002', 'params', 'earlier step'),
    ),
    'checkpoint: trainer state is not JSON': Case(
        lambda f, t: f.gpt2(
            '--resume_from',
            trainer_state_cut(f, t),
        ),
        (
            'damaged/checkpoint_step_000002/trainer_state/metadata',
            'expected JSON',
            'found unreadable content',
            'earlier step',
        ),
    ),
    'checkpoint: trainer state without its rng': Case(
        lambda f, t: f.gpt2('--resume_from', trainer_state_edited(f, t, lambda s: s.pop('rng'))),
        ('damaged/checkpoint_step_000002/trainer_state/metadata', 'rng', 'found none', 'earlier step'),
    ),
    'checkpoint: trainer state with a text step': Case(
        lambda f, t: f.gpt2('--resume_from', trainer_state_edited(f, t, lambda s: s.update(step='two'))),
        (
            'damaged/checkpoint_step_000002/trainer_state/metadata',
            'step',
            'expected an integer',
            "found 'two'",
        ),
    ),
    'checkpoint: trainer state with a negative data position': Case(
        lambda f, t: f.gpt2(
            '--resume_from', trainer_state_edited(f, t, lambda s: s.update(data_position=-5))
        ),
        ('damaged/checkpoint_step_000002/trainer_state/metadata', 'data_position', 'found -5'),
    ),
    'checkpoint: checksum mismatch': Case(
        lambda f, t: f.gpt2('--resume_from', trainer_state_edited(f, t, checksum_changed)),
        ('damaged/checkpoint_step_000002', 'checksum expected 00000000:00000000', 'found', 'earlier step'),
    ),
    'checkpoint: saved for another model': Case(
        lambda f, t: f.gpt2('--resume_from', f.step(2), '--llmc_filepath', f.other_model),
        (
            'checkpoint_step_000002',
            'model_config.vocab_size: checkpoint 512, now 256',
            'without --resume_from',
        ),
    ),
    'checkpoint: model config edited in the trainer state': Case(
        lambda f, t: f.gpt2(
            '--resume_from', trainer_state_edited(f, t, lambda s: s['model_config'].update(num_layers=3))
        ),
        (
            'damaged/checkpoint_step_000002',
            'model_config.num_layers: checkpoint 3, now 2',
            'without --resume_from',
        ),
    ),
    'checkpoint: latest in a directory saved for another model': Case(
        lambda f, t: f.gpt2(
            '--resume_from',
            'latest',
            '--checkpoint_dir',
            f.checkpoints,
            '--save_steps',
            1,
            '--llmc_filepath',
            f.other_model,
        ),
        (
            'checkpoint_step_000002',
            'model_config.vocab_size: checkpoint 512, now 256',
            'without --resume_from',
        ),
    ),
    'checkpoint: nothing at the path': Case(
        lambda f, t: f.gpt2('--resume_from', t / 'checkpoint_step_000009'),
        (
            'resume_from',
            'checkpoint_step_000009',
            'expected a checkpoint_step_NNNNNN directory',
            'found nothing there',
        ),
    ),
    'checkpoint: a checkpoint root where a step is expected': Case(
        lambda f, t: f.gpt2('--resume_from', f.checkpoints),
        (
            'resume_from',
            'expected a step directory',
            'checkpoint_step_000001, checkpoint_step_000002',
            '--resume_from latest --checkpoint_dir',
        ),
    ),
    'checkpoint: a directory that is not a checkpoint': Case(
        lambda f, t: f.gpt2('--resume_from', plain_directory(t)),
        ('resume_from', 'notes', 'found a directory that is not a checkpoint'),
    ),
    'checkpoint: an unfinished save': Case(
        lambda f, t: f.gpt2('--resume_from', unfinished_save(f, t)),
        ('resume_from', 'orbax-checkpoint-tmp-1234', 'expected a committed checkpoint', 'unfinished save'),
    ),
    'checkpoint: latest without a checkpoint_dir': Case(
        lambda f, t: f.gpt2('--resume_from', 'latest'),
        ('resume_from', "'latest' needs checkpoint_dir", 'Pass --checkpoint_dir DIR'),
    ),
    # config
    'config: batch sizes that do not divide': Case(
        # total_batch_size given: a --batch_size alone derives it (tests/config/test_cli_flags.py)
        lambda f, t: f.gpt2('--batch_size', 3, '--total_batch_size', 256),
        (
            'total_batch_size',
            'expected a multiple of',
            '3 × 64 × 1 = 192',
            'found 256',
            'Pass --total_batch_size 192',
        ),
    ),
    'config: negative save_steps': Case(
        lambda f, t: f.gpt2('--save_steps', -1, '--checkpoint_dir', t / 'ck'),
        ('save_steps', 'expected a value >= 0', 'found -1'),
    ),
    'config: negative keep count': Case(
        lambda f, t: f.gpt2('--config.max_checkpoint_keep=-2'),
        ('max_checkpoint_keep', 'expected a value >= 0', 'found -2'),
    ),
    'config: saving without a checkpoint_dir': Case(
        lambda f, t: f.gpt2('--save_steps', 5),
        ('checkpoint_dir', 'expected a directory', 'found none', 'Pass --checkpoint_dir DIR'),
    ),
    'config: unknown model variant': Case(
        lambda f, t: ['--input_bin', f.gpt2_shard, '--model', 'gpt5'],
        ('model', 'expected one of', 'small, tiny', "found 'gpt5'"),
    ),
    'config: unknown variant in the config argument': Case(
        lambda f, t: ['--input_bin', f.llama3_shard],
        ('model', 'expected one of', 'llama3.2-1b', "found '8b'"),
        config=LLAMA3 + ':8b',
    ),
    'config: unknown dtype': Case(
        lambda f, t: f.gpt2('--config.dtype=float16'),
        ('dtype', 'expected one of float32, bfloat16', "found 'float16'"),
    ),
    'config: unknown optimizer': Case(
        lambda f, t: f.gpt2('--optimizer', 'lion'),
        ('optimizer', 'expected one of adamw, adam, sgd', "found 'lion'"),
    ),
    'config: a boolean that is not one': Case(
        lambda f, t: f.gpt2('--save_optimizer_state', 'maybe'),
        ('--save_optimizer_state', 'expected true or false', "found 'maybe'"),
    ),
    'config: a stray argument': Case(
        lambda f, t: f.gpt2('--save_optimizer_state', 'true', 'false'),
        ('unexpected arguments', "'false'", 'flags look like --KEY VALUE'),
    ),
    'config: a typo in a --config key': Case(
        lambda f, t: f.gpt2('--config.batch_sise=8'),
        ('--config.batch_sise', 'expected one of the config keys', 'did you mean --config.batch_size?'),
    ),
    'config: a typo in a plain key': Case(
        lambda f, t: f.gpt2('--checkpoint_dri', t / 'ck'),
        ('--checkpoint_dri', 'expected a known flag', 'did you mean --checkpoint_dir?'),
    ),
    'config: the model family as a flag': Case(
        lambda f, t: f.gpt2('--model_family', 'llama3'),
        ('--model_family', 'the config file sets the family', '--config=configs/llama3.py'),
    ),
    'config: text for an integer key': Case(
        lambda f, t: f.gpt2('--num_iteration', '10k'),
        ('--num_iteration', 'expected an integer', "found '10k'"),
    ),
    'config: a config file that is not there': Case(
        lambda f, t: f.gpt2(),
        ('--config', 'expected a config file', 'found nothing at', 'configs/gtp2.py'),
        config='configs/gtp2.py',
    ),
}


def run_case(files, tmp_path, name, *extra, flags_parser=None):
    case = CASES[name]
    command = [*case.command(files, tmp_path), *extra]
    before = tree_digest(files.root, tmp_path)
    result = run_cli(*command, config=case.config, flags_parser=flags_parser)
    after = tree_digest(files.root, tmp_path)
    return case, result, before == after


def assert_one_clear_line(case, result, unchanged):
    assert result.code not in (0, None), result.out[-2000:]
    assert len(result.error_lines) == 1, result.err
    line = result.error_lines[0]
    assert line.startswith('error: '), line
    missing = [fragment for fragment in case.expected if fragment not in line]
    assert not missing, f'{missing} not in: {line}'
    assert unchanged, 'the input files or checkpoints changed'


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize('name', list(CASES))
def test_bad_input_gives_one_clear_line(files, tmp_path, name):
    assert_one_clear_line(*run_case(files, tmp_path, name))


@pytest.mark.parametrize(
    'name',
    [
        'model: truncated',
        'shard: token id beyond the vocabulary',
        'checkpoint: nothing at the path',
        'config: unknown dtype',
    ],
)
def test_verbose_adds_the_traceback(files, tmp_path, name):
    case, result, unchanged = run_case(files, tmp_path, name, '--verbose')
    assert result.code not in (0, None) and unchanged
    assert 'Traceback (most recent call last)' in result.err
    last = result.error_lines[-1]
    assert last.startswith('error: ') and all(fragment in last for fragment in case.expected), last


def test_the_good_command_line_trains(files, tmp_path):
    """The control: the corpus's commands fail because of their one bad part."""
    result = run_cli(*files.gpt2('--num_iteration', 2, '--resume_from', files.step(1)))
    assert result.code == 0 and result.err == '', result.err
    assert 'restored step 1' in result.out
