"""Upstream names <-> our trees (weights and both Adam key schemes) and trainer_state.json, on tiny shapes.

The name tables are checked against the real files in test_infinitrain_real_files.py; here: round trips,
the libc++ map order on shapes the samples do not cover, and each malformed case of names and JSON.
"""

import json

import numpy as np
import pytest

from llmc_io import LLMCFormatError
from llmc_io.infinitrain import layout
from llmc_io.infinitrain import names
from llmc_io.infinitrain.state import (
    InfiniTrainState,
    read_trainer_state,
    render_trainer_state,
    write_trainer_state,
)
from llmc_io.infinitrain.libcxx_order import LibcxxStringMap, string_hash
from llmc_io.infinitrain.statedict import CkptTensor
from llmc_io.tensors import tree_leaves, tree_set

C, L, V, VP, T, H = 8, 3, 10, 16, 4, 24
SHAPES = {
    'gpt2': {
        'wte/embedding': (VP, C),
        'wpe/embedding': (T, C),
        'h/ln_1/scale': (L, C),
        'h/ln_1/bias': (L, C),
        'h/attn/c_attn/kernel': (L, C, 3 * C),
        'h/attn/c_attn/bias': (L, 3 * C),
        'h/attn/c_proj/kernel': (L, C, C),
        'h/attn/c_proj/bias': (L, C),
        'h/ln_2/scale': (L, C),
        'h/ln_2/bias': (L, C),
        'h/mlp/c_fc/kernel': (L, C, 4 * C),
        'h/mlp/c_fc/bias': (L, 4 * C),
        'h/mlp/c_proj/kernel': (L, 4 * C, C),
        'h/mlp/c_proj/bias': (L, C),
        'ln_f/scale': (C,),
        'ln_f/bias': (C,),
    },
    'llama3': {
        'wte/embedding': (V, C),
        'h/ln_1/scale': (L, C),
        'h/attn/c_attn/kernel': (L, C, 16),
        'h/attn/c_proj/kernel': (L, C, C),
        'h/ln_2/scale': (L, C),
        'h/mlp/c_fc/kernel': (L, C, H),
        'h/mlp/c_fc2/kernel': (L, C, H),
        'h/mlp/c_proj/kernel': (L, H, C),
        'ln_f/scale': (C,),
        'lm_head/kernel': (C, V),
    },
}


def _tree(family, seed):
    rng = np.random.default_rng(seed)
    tree = {}
    for path, shape in SHAPES[family].items():
        value = rng.standard_normal(shape).astype(np.float32)
        if path == 'wte/embedding':
            value[V:] = 0  # llm.c padding rows
        tree_set(tree, path, value)
    return tree


def _equal(a, b):
    la, lb = tree_leaves(a), tree_leaves(b)
    return la.keys() == lb.keys() and all(np.array_equal(la[k], lb[k]) for k in la)


@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
def test_weights_round_trip(family):
    tree = _tree(family, 0)
    sd = names.tree_to_state_dict(family, tree, V, T)
    assert list(sd) == list(layout.state_dict_order(family, L))
    assert sd['transformer.wte.weight'].shape == (V, C)
    qkv = sd['transformer.h.2.attn.c_attn.weight'].array  # (out, in): the transpose of layer 2's kernel
    assert np.array_equal(qkv, tree['h']['attn']['c_attn']['kernel'][2].T)
    if family == 'gpt2':
        assert sd['lm_head.weight'].array.tobytes() == sd['transformer.wte.weight'].array.tobytes()
    else:
        assert np.array_equal(sd['lm_head.weight'].array, tree['lm_head']['kernel'].T)
    assert _equal(names.state_dict_to_tree('x.ckpt', sd, SHAPES[family]), tree)


@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
@pytest.mark.parametrize('head_keys', [True, False])
def test_moments_round_trip(family, head_keys):
    mu, nu = _tree(family, 1), _tree(family, 2)
    sd = names.trees_to_moments(family, mu, nu, 7, V, head_keys)
    assert list(sd) == list(layout.adam_key_order(family, L, head_keys))
    n_params = len(layout.parameter_order(family, L))
    assert len(sd) == 2 * n_params + 1 and int(sd['adam.t'].array) == 7 and sd['adam.t'].dtype == 8
    assert ('adam.m.0' in sd) == head_keys and ('adam.m.transformer.wte.weight' in sd) != head_keys
    mu2, nu2, t = names.moments_to_trees('o.ckpt', sd, SHAPES[family])
    assert t == 7 and _equal(mu2, mu) and _equal(nu2, nu)


def test_a_tied_llama_is_stored_twice_and_read_back_tied():
    """Upstream's LLaMA-3 has its own lm_head.weight: a tied tree writes wte there too (and its Adam
    moments), reads back without lm_head, and a file whose two copies differ is refused."""
    shapes = {k: v for k, v in SHAPES['llama3'].items() if k != 'lm_head/kernel'}
    tree = _tree('llama3', 3)
    del tree['lm_head']
    sd = names.tree_to_state_dict('llama3', tree, V, T)
    assert list(sd) == list(layout.state_dict_order('llama3', L))
    assert sd['lm_head.weight'].array.tobytes() == sd['transformer.wte.weight'].array.tobytes()
    assert _equal(names.state_dict_to_tree('x.ckpt', sd, shapes), tree)
    mu, nu = _tree('llama3', 4), _tree('llama3', 5)
    del mu['lm_head'], nu['lm_head']
    mu2, nu2, _ = names.moments_to_trees(
        'o.ckpt', names.trees_to_moments('llama3', mu, nu, 3, V, True), shapes
    )
    assert _equal(mu2, mu) and _equal(nu2, nu)
    sd['lm_head.weight'] = CkptTensor(sd['lm_head.weight'].dtype, sd['lm_head.weight'].array + 1)
    with pytest.raises(LLMCFormatError, match="lm_head.weight': expected the same bytes as transformer.wte"):
        names.state_dict_to_tree('x.ckpt', sd, shapes)


def test_name_that_does_not_fit_the_model():
    sd = names.tree_to_state_dict('llama3', _tree('llama3', 0), V, T)
    sd['transformer.h.7.ln_1.weight'] = sd['transformer.h.0.ln_1.weight']
    with pytest.raises(
        LLMCFormatError, match=r"x.ckpt: tensor 'transformer.h.7.ln_1.weight': expected a name"
    ):
        names.state_dict_to_tree('x.ckpt', sd, SHAPES['llama3'])
    del sd['transformer.h.7.ln_1.weight']
    del sd['lm_head.weight']
    with pytest.raises(LLMCFormatError, match=r"tensor 'lm_head.weight': expected present, found missing"):
        names.state_dict_to_tree('x.ckpt', sd, SHAPES['llama3'])
    gpt = names.tree_to_state_dict('gpt2', _tree('gpt2', 0), V, T)
    with pytest.raises(LLMCFormatError, match='model family: expected llama3, found gpt2'):
        names.state_dict_to_tree('x.ckpt', gpt, SHAPES['llama3'])
    gpt['lm_head.weight'] = CkptTensor(11, gpt['lm_head.weight'].array + 1)
    with pytest.raises(LLMCFormatError, match='GPT-2 ties them'):
        names.state_dict_to_tree('x.ckpt', gpt, SHAPES['gpt2'])


def test_libcxx_map_order_by_hand():
    # Two keys in a 2-bucket table: an empty bucket puts the newcomer at the list's front, a shared bucket
    # at its run's front, which is the list's front too; either way the second key comes first.
    assert LibcxxStringMap(['ln_1', 'ln_2']).keys() == ['ln_2', 'ln_1']
    assert LibcxxStringMap(['ln_2', 'ln_1']).keys() == ['ln_1', 'ln_2']
    # Growth through several rehashes keeps every key exactly once.
    keys = [f'k{i}' for i in range(200)]
    assert sorted(LibcxxStringMap(keys).keys()) == sorted(keys)
    # Known libc++ CityHash64 values are pinned by the real-file order tests; here the empty string:
    assert string_hash('') == 0x9AE16A3B2F90404F


def test_trainer_state_writer_is_valid_json_with_upstream_keys_first(tmp_path):
    state = InfiniTrainState(
        'head',
        40,
        40,
        1e-05,
        shape={'n_layer': 12, 'n_head': 12, 'n_kv_head': 12, 'n_embd': 768, 'vocab_size': 50304},
        jaxtrain={'global_step': 999, 'loss': 3.5},
    )
    path = tmp_path / 'trainer_state.json'
    write_trainer_state(path, state)
    text = path.read_text()
    data = json.loads(text)
    assert list(data)[:12] == [
        'n_layer',
        'n_head',
        'n_kv_head',
        'n_embd',
        'vocab_size',
        'global_step',
        'consumed_batches',
        'last_lr',
        'ddp_size',
        'tp_size',
        'sp_size',
        'pp_size',
    ]
    assert '"last_lr": 1e-05,' in text  # C++ ostream's %g, as upstream prints it
    # Upstream's extractor takes the first "global_step": ours, not the one inside "jaxtrain".
    assert text.index('"global_step": 40') < text.index('"jaxtrain"')
    back = read_trainer_state(path)
    assert (back.global_step, back.data_batch_idx, back.jaxtrain, back.notices) == (
        40,
        40,
        state.jaxtrain,
        [],
    )
    pr = InfiniTrainState(
        'pr', 0, 0, 0.01, best_loss=float('inf'), optimizer_type='Adam', checkpoint_format='bin'
    )
    assert '"best_loss": null,' in render_trainer_state(pr)


@pytest.mark.parametrize(
    'text,field',
    [
        ('{"global_step": 3}', 'consumed_batches / data_batch_idx'),
        ('{"consumed_batches": 3, "last_lr": 0.1}', 'global_step'),
        ('{"global_step": "x", "consumed_batches": 3, "last_lr": 0.1}', 'global_step'),
        ('not json at all', 'JSON'),
        ('[1, 2]', 'top level'),
    ],
)
def test_malformed_trainer_state(tmp_path, text, field):
    path = tmp_path / 'trainer_state.json'
    path.write_text(text)
    with pytest.raises(LLMCFormatError) as err:
        read_trainer_state(path)
    assert err.value.field == field and str(err.value).startswith(str(path))


def test_missing_trainer_state(tmp_path):
    with pytest.raises(LLMCFormatError, match='trainer_state.json: expected a file, found nothing there'):
        read_trainer_state(tmp_path / 'trainer_state.json')


def test_pr_inf_best_loss_is_read(tmp_path):
    path = tmp_path / 'trainer_state.json'
    path.write_text(
        '{\n  "global_step": 0,\n  "data_batch_idx": 0,\n  "best_loss": inf,\n  "last_lr": 0.01\n}\n'
    )
    assert read_trainer_state(path).best_loss == float('inf')


def test_accelerator_parameter_order():
    # Module::To(cuda) rebuilds each module's maps: LLaMA-3's one-parameter modules keep their order, so a
    # GPU-written HEAD optimizer.ckpt maps like the CPU samples; GPT-2's weight/bias maps flip,
    # and its tie breaks.
    for layers in (1, 2, 16):
        assert layout.parameter_order('llama3', layers, 'cuda') == layout.parameter_order('llama3', layers)
    cuda = layout.parameter_order('gpt2', 2, 'cuda')
    assert (
        cuda != layout.parameter_order('gpt2', 2) and len(cuda) == len(layout.parameter_order('gpt2', 2)) + 1
    )
    assert {'lm_head.weight', 'transformer.wte.weight'} <= set(cuda)


def _cpp_extract(content, key, kind, fallback):
    """InfiniTrain's ExtractNumberField / ExtractStringField (b24d92f checkpoint.cc, f9cb65b5 checkpoint.cc),
    re-implemented: first '"key"', then ':', skip spaces and newlines, read to ',' / newline / '}', then
    `std::stringstream >> T` (a leading number; failure keeps the fallback)."""
    at = content.find(f'"{key}"')
    if at < 0:
        return fallback
    colon = content.find(':', at)
    if kind is str:
        first = content.find('"', colon + 1)
        second = content.find('"', first + 1)
        return content[first + 1 : second]
    start = colon + 1
    while start < len(content) and content[start] in ' \n':
        start += 1
    end = start
    while end < len(content) and content[end] not in ',\n}':
        end += 1
    import re

    number = re.match(
        r'[+-]?\d+' if kind is int else r'[+-]?(\d+\.?\d*([eE][+-]?\d+)?|inf)', content[start:end]
    )
    return kind(number.group(0)) if number else fallback


@pytest.mark.parametrize('generation', ['head', 'pr'])
def test_upstreams_extractor_reads_what_we_write(generation):
    extras = {'global_step': 1, 'last_lr': 9.0, 'consumed_batches': 2, 'data_batch_idx': 3, 'note': 'x, y}'}
    if generation == 'head':
        state = InfiniTrainState(
            'head',
            40,
            80,
            0.0003,
            shape=dict.fromkeys(('n_layer', 'n_head', 'n_kv_head', 'n_embd', 'vocab_size'), 7),
            ddp_size=2,
            jaxtrain=extras,
        )
        fields = {'global_step': 40, 'consumed_batches': 80, 'n_layer': 7, 'vocab_size': 7, 'ddp_size': 2}
    else:
        state = InfiniTrainState(
            'pr',
            40,
            80,
            0.0003,
            data_batch_stride=2,
            best_loss=float('inf'),
            optimizer_type='Adam',
            checkpoint_format='bin',
            ddp_size=2,
            jaxtrain=extras,
        )
        fields = {'global_step': 40, 'data_batch_idx': 80, 'data_batch_stride': 2, 'ddp_size': 2}
    text = render_trainer_state(state)
    json.loads(text)
    for key, value in fields.items():
        assert _cpp_extract(text, key, int, 0) == value, key
    assert _cpp_extract(text, 'last_lr', float, 0.0) == 0.0003
    assert _cpp_extract(text, 'tp_size', int, 1) == 1
    if generation == 'pr':
        assert _cpp_extract(text, 'best_loss', float, float('inf')) == float('inf')  # null -> the default
        assert _cpp_extract(text, 'optimizer_type', str, 'unknown') == 'Adam'
        assert _cpp_extract(text, 'checkpoint_format', str, 'bin') == 'bin'


def test_cp_size_is_read_and_written_where_upstream_puts_it(tmp_path):
    # feat/context_parallel abce8d2, checkpoint.cc SaveTrainerState: cp_size between sp_size and pp_size.
    text = (
        '{\n  "n_layer": 12,\n  "n_head": 12,\n  "n_kv_head": 12,\n  "n_embd": 768,\n  "vocab_size": 50304,\n'
        '  "global_step": 20,\n  "consumed_batches": 40,\n  "last_lr": 0.0001,\n  "ddp_size": 2,\n'
        '  "tp_size": 1,\n  "sp_size": 1,\n  "cp_size": 2,\n  "pp_size": 1\n}\n'
    )
    path = tmp_path / 'trainer_state.json'
    path.write_text(text)
    state = read_trainer_state(path)
    assert (state.cp_size, state.pp_size, state.ddp_size) == (2, 1, 2)
    write_trainer_state(tmp_path / 'again.json', state)
    assert (tmp_path / 'again.json').read_text() == text
    # a file of an older generation has no cp_size, and none is written back
    path.write_text(text.replace('  "cp_size": 2,\n', ''))
    state = read_trainer_state(path)
    assert state.cp_size is None
    write_trainer_state(tmp_path / 'again.json', state)
    assert 'cp_size' not in (tmp_path / 'again.json').read_text()


class _DeviceLeaf:
    """Stands for a leaf on a device: the writer may index it (a layer) and fetch it, and each
    fetch is counted, so the test sees what crossed to the host and in what pieces."""

    def __init__(self, array, fetched, index=None):
        self.array, self.fetched, self.index = array, fetched, index
        self.shape = array.shape if index is None else array.shape[1:]

    def __getitem__(self, index):
        return _DeviceLeaf(self.array, self.fetched, index)

    def __array__(self, dtype=None, copy=None):
        value = self.array if self.index is None else self.array[self.index]
        self.fetched.append(value.nbytes)
        return np.array(value, dtype=dtype)


@pytest.mark.parametrize('family, tied', [('gpt2', True), ('llama3', False), ('llama3', True)])
def test_leaves_off_the_host_are_written_the_same_bytes_an_entry_at_a_time(family, tied):
    """A background save's leaves are on the device: the state-dict bytes are those of the NumPy
    tree, nothing is fetched before the bytes are made, and each stacked leaf crosses a layer at a
    time (never whole), so the host holds the entries being written."""
    from llmc_io.infinitrain.statedict import state_dict_bytes

    params, mu, nu = _tree(family, 3), _tree(family, 4), _tree(family, 5)
    if family == 'llama3' and tied:
        for tree in (params, mu, nu):
            del tree['lm_head']
    fetched = []

    def on_device(tree):
        out = {}
        for path, value in tree_leaves(tree).items():
            tree_set(out, path, _DeviceLeaf(value, fetched))
        return out

    stacked = [v for v in tree_leaves(params).values() if v.ndim == 3]
    cases = (
        (
            names.tree_to_state_dict(family, params, V, T),
            names.tree_to_state_dict(family, on_device(params), V, T),
        ),
        (
            names.trees_to_moments(family, mu, nu, 7, V, head_keys=True),
            names.trees_to_moments(family, on_device(mu), on_device(nu), 7, V, head_keys=True),
        ),
    )
    for host, deferred in cases:
        assert fetched == []  # nothing crossed yet
        assert state_dict_bytes(deferred) == state_dict_bytes(host)
        assert max(fetched) < max(v.nbytes for v in stacked)  # no stacked leaf whole
        assert max(v[0].nbytes for v in stacked) in fetched  # its layers, one at a time
        fetched.clear()
