"""InfiniTrain step directories on disk (jaxtrain/checkpoint/formats/infinitrain/steps.py): both kinds
written, read back, atomic writes, rank_* subdirectories, the data position, and each malformed directory.

The real files in ../shared/infinitrain are the independent reference: a copy of a real step directory is
read, re-written through our writer and compared byte for byte.
"""

import shutil

import numpy as np
import pytest

import llmc_io
from infinitrain_samples import SAMPLES, needs_samples, unpacked
from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain import writer
from llmc_io import LLMCFormatError
from llmc_io.infinitrain.state import InfiniTrainState
from llmc_io.tensors import tree_leaves


@pytest.fixture(scope='module')
def real():
    if not SAMPLES.is_dir():
        pytest.skip(f'{SAMPLES} absent')
    return unpacked()  # read only: a test damages its own copy


def _equal(a, b):
    la, lb = tree_leaves(a), tree_leaves(b)
    return la.keys() == lb.keys() and all(np.array_equal(la[k], lb[k]) for k in la)


@needs_samples
@pytest.mark.parametrize(
    'folder,kind',
    [
        ('head-llama3', it.HEAD_KIND),
        ('pr-llama3', it.PR_BIN_KIND),
        ('head-gpt2', it.HEAD_KIND),
        ('pr-gpt2', it.PR_BIN_KIND),
    ],
)
def test_real_step_dir_rewritten_byte_for_byte(real, tmp_path, folder, kind):
    src = real / folder / 'a' / 'checkpoint_step_000010'
    ckpt = it.read_checkpoint(src)
    assert (ckpt.kind, ckpt.state.global_step, ckpt.ranks) == (kind, 10, 1)
    header, _ = llmc_io.load_model(real / folder / 'model.bin')
    out = writer.write_checkpoint(
        tmp_path / 'checkpoint_step_000010', kind, ckpt.family, ckpt.params, header, ckpt.moments, ckpt.state
    )
    model, opt = it.FILES[kind]
    # HEAD: the CKPT file in libc++ order; PR: SaveAsLLMC's llm.c file (no vocab padding, major/minor 1/0).
    assert (out / model).read_bytes() == (src / model).read_bytes()
    if ckpt.moments is not None:
        assert (out / opt).read_bytes() == (src / opt).read_bytes()
    else:
        assert not (out / opt).exists() and not (src / opt).exists()  # SGD: no optimizer file, as upstream
    written = (out / it.TRAINER_STATE).read_text()
    expected = (src / it.TRAINER_STATE).read_text()
    assert written.replace(',\n  "global_step"', '\n  "global_step"') == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ['checkpoint_step_000010']  # no temporary left


@needs_samples
def test_rank_directories(real, tmp_path):
    """Copies of a one-GPU step are not a two-GPU step: the count and the DDP `module.` prefix are checked
    (a real split is in tests/checkpoint/test_infinitrain_topologies.py)."""
    step = tmp_path / 'checkpoint_step_000010'
    for r in range(2):
        shutil.copytree(real / 'head-gpt2' / 'a' / 'checkpoint_step_000010', step / f'rank_{r:06d}')
    assert it.detect_kind(step) == it.HEAD_KIND
    with pytest.raises(LLMCFormatError, match=r'expected ddp x tp x pp = 1 x 1 x 1 = 1 .*found 2'):
        it.read_checkpoint(step)
    for r in range(2):
        state = step / f'rank_{r:06d}' / 'trainer_state.json'
        state.write_text(state.read_text().replace('"ddp_size": 1', '"ddp_size": 2'))
    with pytest.raises(
        LLMCFormatError, match=r"rank_000000/model.ckpt: tensor '[^']+': expected a name .*module"
    ):
        it.read_checkpoint(step)
    shutil.rmtree(step / 'rank_000000')
    with pytest.raises(
        LLMCFormatError, match=r'rank_000000: expected a directory \(ranks are 0..N-1\), found missing'
    ):
        it.read_checkpoint(step)
    (step / 'rank_000001' / 'trainer_state.json').unlink()
    shutil.copytree(step / 'rank_000001', step / 'rank_000000')
    with pytest.raises(LLMCFormatError, match='trainer_state.json: file: expected present, found missing'):
        it.read_checkpoint(step)


@needs_samples
def test_names_that_do_not_fit_the_run(real):
    src = real / 'head-llama3' / 'a' / 'checkpoint_step_000010'
    wrong = {
        path: shape
        for path, shape in {
            k: v.shape for k, v in tree_leaves(it.read_checkpoint(src).params).items()
        }.items()
    }
    wrong['h/ln_1/scale'] = (3, 8)  # a 3-layer model
    wrong['h/attn/c_attn/kernel'] = (3, 8, 16)
    with pytest.raises(
        LLMCFormatError, match="tensor 'transformer.h.2.attn.c_attn.weight': expected present, found missing"
    ):
        it.read_checkpoint(src, wrong)
    gpt_shapes = {
        k: v.shape
        for k, v in tree_leaves(
            it.read_checkpoint(real / 'head-gpt2/a/checkpoint_step_000010').params
        ).items()
    }
    with pytest.raises(LLMCFormatError, match='model family: expected gpt2, found llama3'):
        it.read_checkpoint(src, gpt_shapes)
    with pytest.raises(LLMCFormatError, match='model.bin: model family: expected gpt2, found llama3'):
        it.read_checkpoint(real / 'pr-llama3' / 'a' / 'checkpoint_step_000010', gpt_shapes)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(LLMCFormatError, match='model file: expected model.ckpt, model.bin or model.pth'):
        it.read_checkpoint(tmp_path)
    assert it.detect_kind(tmp_path) is None and it.detect_kind(tmp_path / 'nothing') is None


def test_data_position_translation():
    # One of our steps = accumulation x data-parallel InfiniTrain batches.
    assert it.position_from_batch_index(40, 4) == 10 and it.batch_index_from_position(10, 4) == 40
    with pytest.raises(LLMCFormatError, match='data_batch_idx: expected a multiple of 4'):
        it.position_from_batch_index(41, 4)


def test_failed_write_leaves_nothing(tmp_path):
    header = llmc_io.GPT2Header(
        max_seq_len=4, vocab_size=8, padded_vocab_size=8, num_layers=1, num_heads=1, channels=4
    )
    params = {'wte': {'embedding': np.full((8, 4), np.nan, np.float32)}}  # not a whole GPT-2 tree
    state = InfiniTrainState('pr', 1, 1, 0.1, optimizer_type='SGD', checkpoint_format='bin')
    with pytest.raises(LLMCFormatError):
        writer.write_checkpoint(
            tmp_path / 'checkpoint_step_000001', it.PR_BIN_KIND, 'gpt2', params, header, None, state
        )
    assert list(tmp_path.iterdir()) == []


def test_prune_keeps_newest_and_protected(tmp_path):
    for step in (5, 10, 15, 20):
        d = tmp_path / f'checkpoint_step_{step:06d}'
        d.mkdir()
        (d / 'model.ckpt').write_bytes(b'')
    (tmp_path / ('checkpoint_step_000025' + '.infinitrain-tmpabc')).mkdir()
    removed = it.prune(tmp_path, 2, protected_steps={5})
    assert [p.name for p in removed] == ['checkpoint_step_000010']
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        'checkpoint_step_000005',
        'checkpoint_step_000015',
        'checkpoint_step_000020',
    ]
    assert it.prune(tmp_path, 1, keep_every=15) == [tmp_path / 'checkpoint_step_000005']
