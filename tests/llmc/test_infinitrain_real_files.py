"""Every file the real InfiniTrain binary wrote (../shared/infinitrain): read, checked against the READMEs.

Checks: md5 of each file as written (README tables), CKPT entry names / order / shapes / dtypes, tied
wte == lm_head bytes and the causal masks in GPT-2, the Adam index -> name table (adam_map.txt) equal to the
one llmc_io derives from upstream's code, HEAD positional == PR name-keyed moments, the PR's llm.c model.bin
equal to HEAD's model.ckpt, byte-identical re-serialisation, and every trainer_state.json.
"""

import hashlib
import re

import numpy as np
import pytest

import llmc_io
from infinitrain_samples import FOLDERS, SAMPLES, listed_md5s, needs_samples, step_dirs, unpacked
from llmc_io.infinitrain import layout
from llmc_io.infinitrain import names
from llmc_io.infinitrain.state import CONFIG_DEFAULTS, read_trainer_state, render_trainer_state
from llmc_io.infinitrain.statedict import read_state_dict, state_dict_bytes

pytestmark = needs_samples
FAMILY = {
    'head-gpt2': 'gpt2',
    'pr-gpt2': 'gpt2',
    'lrs-gpt2': 'gpt2',
    'head-llama3': 'llama3',
    'pr-llama3': 'llama3',
    'lrs-llama3': 'llama3',
}
BEST_LOSS = {
    ('pr-gpt2', 10): 6.23609,
    ('pr-gpt2', 20): 6.21786,
    ('pr-llama3', 10): 6.23572,
    ('pr-llama3', 20): 6.23331,
}


@pytest.fixture(scope='module')
def real():
    return unpacked()  # read only: a test damages its own copy


@pytest.mark.parametrize('folder', FOLDERS)
def test_md5_of_every_listed_file(real, folder):
    listed = listed_md5s(folder)
    assert len(listed) >= 8
    for rel, md5 in listed.items():
        assert hashlib.md5((real / folder / rel).read_bytes()).hexdigest() == md5, rel


def _ckpt_files(real):
    """Every CKPT state dict (lr_scheduler.ckpt is another format: test_infinitrain_lr_scheduler_file.py)."""
    return sorted(
        p
        for p in real.rglob('*')
        if (p.suffix in ('.ckpt', '.pth') or p.name == 'optimizer.bin') and p.name != 'lr_scheduler.ckpt'
    )


def test_every_ckpt_file_reads_and_rewrites_byte_identically(real):
    files = _ckpt_files(real)
    # head-gpt2 3, head-llama3 4+4, pr-gpt2 1 pth, pr-llama3 3 optimizer.bin; lrs-gpt2 5, lrs-llama3 3+3
    assert len(files) == 26
    for path in files:
        folder = path.relative_to(real).parts[0]
        family = FAMILY[folder]
        tensors = read_state_dict(path)
        assert state_dict_bytes(tensors) == path.read_bytes(), path
        if path.stem == 'optimizer':
            head = not folder.startswith('pr')  # PR 151's branch predates the name-keyed moments
            assert list(tensors) == list(layout.adam_key_order(family, 2, head_keys=head)), path
            assert tensors['adam.t'].dtype == 8 and tensors['adam.t'].shape == ()
            step = int(re.search(r'checkpoint_step_(\d+)', str(path)).group(1))
            assert int(tensors['adam.t'].array) == step
            assert {t.dtype for k, t in tensors.items() if k != 'adam.t'} == {11}
        else:
            assert list(tensors) == list(layout.state_dict_order(family, 2)), path
            assert {t.dtype for t in tensors.values()} == {11}
            if family == 'gpt2':
                assert len(tensors) == 31
                wte, head = tensors['transformer.wte.weight'].array, tensors['lm_head.weight'].array
                assert wte.shape == (512, 96) and wte.tobytes() == head.tobytes()
                for i in range(2):
                    assert np.array_equal(
                        tensors[f'transformer.h.{i}.attn.bias'].array, names.causal_mask(64)
                    )
            else:
                assert len(tensors) == 17
                assert tensors['lm_head.weight'].shape == (128256, 8)
                assert tensors['transformer.h.0.attn.c_attn.weight'].shape == (16, 8)
                assert tensors['transformer.h.0.mlp.c_fc2.weight'].shape == (48, 8)


def test_adam_index_table_derived_from_upstream_code_equals_the_measured_one():
    table = {}
    for line in (SAMPLES / 'head-llama3' / 'adam_map.txt').read_text().splitlines():
        m = re.match(r'adam\.\*\.(\d+)\s+shape \([^)]*\)\s+-> (\S+)', line)
        if m:
            table[int(m.group(1))] = m.group(2)
    assert len(table) == 17
    assert layout.parameter_order('llama3', 2) == tuple(table[i] for i in range(17))


@pytest.mark.parametrize('step', [10, 20])
def test_head_positional_moments_equal_pr_name_keyed_ones(real, step):
    d = f'checkpoint_step_{step:06d}'
    head = read_state_dict(real / 'head-llama3' / 'a' / d / 'optimizer.ckpt')
    pr = read_state_dict(real / 'pr-llama3' / 'a' / d / 'optimizer.bin')
    for i, name in enumerate(layout.parameter_order('llama3', 2)):
        for kind in 'mv':
            assert head[f'adam.{kind}.{i}'].array.tobytes() == pr[f'adam.{kind}.{name}'].array.tobytes()


@pytest.mark.parametrize(
    'folder,step', [('pr-gpt2', 10), ('pr-gpt2', 20), ('pr-llama3', 10), ('pr-llama3', 20)]
)
def test_pr_llmc_model_bin_maps_to_heads_model_ckpt(real, folder, step):
    d = f'checkpoint_step_{step:06d}'
    header, params = llmc_io.load_model(real / folder / 'a' / d / 'model.bin')
    family = FAMILY[folder]
    head_file = real / f'head-{family}' / 'a' / d / 'model.ckpt'
    written = names.tree_to_state_dict(family, params, header.vocab_size, header.max_seq_len)
    assert state_dict_bytes(written) == head_file.read_bytes()  # our writer == the real binary, byte for byte
    shapes = {k: v.shape for k, v in llmc_io.tensors.tree_leaves(params).items()}
    back = names.state_dict_to_tree(head_file, read_state_dict(head_file), shapes)
    for k, v in llmc_io.tensors.tree_leaves(params).items():
        assert np.array_equal(llmc_io.tensors.tree_leaves(back)[k], v), k


def test_every_trainer_state(real):
    dirs = [d for d in step_dirs(real) if d.relative_to(real).parts[0] in FOLDERS]
    assert len(dirs) == 15
    for d in dirs:
        folder = d.relative_to(real).parts[0]
        path = d / 'trainer_state.json'
        state = read_trainer_state(path)
        step = 20 if d.name == 'checkpoint_final' else int(d.name.rsplit('_', 1)[1])
        assert (state.global_step, state.data_batch_idx, state.last_lr) == (step, step, 0.01)
        assert (state.ddp_size, state.tp_size, state.sp_size, state.pp_size) == (1, 1, 1, 1)
        text = render_trainer_state(state)
        if folder.startswith('head'):
            assert state.generation == 'head' and state.shape == CONFIG_DEFAULTS[FAMILY[folder]]
            assert len(state.notices) == 1 and 'no comma after "vocab_size"' in state.notices[0]
            assert text.replace(',\n  "global_step"', '\n  "global_step"') == path.read_text()
        else:
            assert state.generation == 'pr' and state.best_loss == BEST_LOSS[folder, step]
            assert state.optimizer_type == ('SGD' if 'gpt2' in folder else 'Adam')
            assert state.checkpoint_format == ('pth' if d.parent.name == 'p' else 'bin')
            assert not state.notices and text == path.read_text()


def test_every_lr_scheduler_generation_trainer_state(real):
    """PR 151 (lrs-*): HEAD's keys less last_lr, valid JSON, the config-default shape; rewritten exactly."""
    dirs = [d for d in step_dirs(real) if d.relative_to(real).parts[0].startswith('lrs-')]
    assert len(dirs) == 8  # lrs-gpt2 a 10 20, b 20, l 20, n 10; lrs-llama3 a 10 20, b 20
    for d in dirs:
        folder = d.relative_to(real).parts[0]
        path = d / 'trainer_state.json'
        state = read_trainer_state(path)
        step = int(d.name.rsplit('_', 1)[1])
        found = (state.generation, state.global_step, state.data_batch_idx, state.last_lr)
        assert found == ('lrs', step, step, None)
        assert state.shape == CONFIG_DEFAULTS[FAMILY[folder]] and not state.notices
        assert render_trainer_state(state) == path.read_text()
