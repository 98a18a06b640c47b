"""--lora_save_path / --lora_load_path against InfiniTrain's LoRA weights file. The writer
here follows SaveLoRAWeights (InfiniTrain commit b24d92f, infini_train/src/nn/lora/lora_utils.cc)
line by line: uint32 magic 0x4C4F5241, uint32 version 1, uint32 count, then per tensor uint32
name length, the name, uint32 ndims, int64 dims, fp32 data, tensors in unordered_map order
(any order; shuffled here). Ours must write the same bytes for the same order, read any
order, and refuse, in one line, a file that does not fit the model or its targets.

PR 150 (branch lora_ddp_loss, f408788, the same file) writes whole tensors gathered from the
TP shards, c_attn's B restored to [Q | K | V], names std::sort-ed, no DDP prefix; its loader
still takes `module.`-prefixed names. pr150_save_lora_weights below redoes that from the
per-rank shards LoRA{Column,Row}ParallelLinear hold."""

import struct

import numpy as np
import pytest
from tiny_models import tiny_header
from trainer_runs import load_config, tiny_llmc_model

from jaxtrain.models.lora import save_lora_weights
from jaxtrain.models.setup import setup_model


def infinitrain_save_lora_weights(path, state_dict: list[tuple[str, np.ndarray]]):
    with open(path, 'wb') as f:
        f.write(struct.pack('<I', 0x4C4F5241))  # magic "LORA"
        f.write(struct.pack('<I', 1))  # version
        f.write(struct.pack('<I', len(state_dict)))
        for name, tensor in state_dict:
            f.write(struct.pack('<I', len(name)))
            f.write(name.encode())
            f.write(struct.pack('<I', tensor.ndim))
            for dim in tensor.shape:
                f.write(struct.pack('<q', dim))
            f.write(np.asarray(tensor, '<f4').tobytes())


def infinitrain_state_dict(num_layers, modules, shapes, rank, seed=0):
    """{name: tensor} as LoRAStateDict names them: transformer.h.{i}.<module>.lora_A (r, in),
    lora_B (out, r)."""
    rng = np.random.default_rng(seed)
    tensors = []
    for i in range(num_layers):
        for module in modules:
            n_in, n_out = shapes[module]
            tensors.append(
                (f'transformer.h.{i}.{module}.lora_A', rng.normal(size=(rank, n_in)).astype(np.float32))
            )
            tensors.append(
                (f'transformer.h.{i}.{module}.lora_B', rng.normal(size=(n_out, rank)).astype(np.float32))
            )
    return tensors


COLUMN_PARALLEL = ('attn.c_attn', 'mlp.c_fc', 'mlp.c_fc2')  # the rest are RowParallel


def tp_local_shards(name, full, tp, q_rows):
    """What each TP rank's LoRA{Column,Row}ParallelLinear holds of a whole tensor: column
    B split on dim 0 (c_attn's as [Qi | Ki | Vi]), row A split on dim 1, the rest replicated."""
    module, which = name.rsplit('.', 1)
    module = '.'.join(module.split('.')[-2:])
    if module in COLUMN_PARALLEL and which == 'lora_B':
        if module == 'attn.c_attn':  # SlicePackedQKVRowsForTensorParallel
            kv = (len(full) - q_rows) // 2
            q, k, v = full[:q_rows], full[q_rows : q_rows + kv], full[q_rows + kv :]
            q, k, v = np.split(q, tp), np.split(k, tp), np.split(v, tp)
            return [np.concatenate([q[r], k[r], v[r]]) for r in range(tp)]
        return np.split(full, tp, axis=0)
    if module not in COLUMN_PARALLEL and which == 'lora_A':
        return np.split(full, tp, axis=1)
    return [full] * tp


def pr150_export(name, shards, tp, q_rows):
    """ExportLoRATensorForSave: GatherTensorParallelShard (AllGather stacks on dim 0; a dim-1
    shard is split back rank-major and concatenated on dim 1) and
    RestorePackedQKVRowsFromTensorParallel for c_attn's B."""
    module, which = name.rsplit('.', 1)
    module = '.'.join(module.split('.')[-2:])
    replicated = (module in COLUMN_PARALLEL) == (which == 'lora_A')
    if replicated or tp == 1:
        return shards[0]
    gathered = np.concatenate(shards, axis=0)
    if which == 'lora_A':  # row parallel: dim 1
        return np.concatenate(np.split(gathered, tp, axis=0), axis=1)
    if module != 'attn.c_attn':
        return gathered
    local = len(gathered) // tp
    q_local = q_rows // tp
    kv_local = (local - q_local) // 2
    parts = [gathered[r * local : r * local + q_local] for r in range(tp)]
    parts += [gathered[r * local + q_local : r * local + q_local + kv_local] for r in range(tp)]
    parts += [gathered[r * local + q_local + kv_local : (r + 1) * local] for r in range(tp)]
    return np.concatenate(parts, axis=0)


def pr150_save_lora_weights(path, tensors, tp, q_rows):
    """SaveLoRAWeights at f408788 on a TP `tp` run: every tensor gathered from its rank
    shards, names in std::sort order (bytes), written as b24d92f did."""
    exported = [
        (name, pr150_export(name, tp_local_shards(name, full, tp, q_rows), tp, q_rows))
        for name, full in sorted(tensors, key=lambda row: row[0].encode())
    ]
    infinitrain_save_lora_weights(path, exported)


C = 32  # tests/trainer_runs.tiny_llmc_model: GPT-2, L 2, C 32
SHAPES = {'attn.c_attn': (C, 3 * C), 'attn.c_proj': (C, C), 'mlp.c_fc': (C, 4 * C), 'mlp.c_proj': (4 * C, C)}
DEFAULT_MODULES = ('attn.c_attn', 'attn.c_proj', 'mlp.c_proj')  # what 'c_attn,c_proj' selects


@pytest.fixture(scope='module')
def model(tmp_path_factory):
    return tiny_llmc_model(tmp_path_factory.mktemp('lora_file') / 'model.bin')


def _setup(model, **lora):
    return setup_model(load_config('gpt2', llmc_filepath=model, **{'lora_rank': 8, **lora}))


def test_an_infinitrain_file_loads_in_any_order_and_saves_back_byte_for_byte(model, tmp_path):
    tensors = infinitrain_state_dict(2, DEFAULT_MODULES, SHAPES, rank=8)
    shuffled = [tensors[i] for i in np.random.default_rng(1).permutation(len(tensors))]
    theirs = tmp_path / 'theirs.bin'
    infinitrain_save_lora_weights(theirs, shuffled)
    setup = _setup(model, lora_load_path=str(theirs))
    for name, tensor in tensors:
        _, _, layer, group, module, which = name.split('.')
        np.testing.assert_array_equal(
            np.asarray(setup.lora_params['h'][group][module][which][int(layer)]), tensor
        )

    ours = tmp_path / 'ours.bin'
    save_lora_weights(str(ours), setup.lora_params, 'head')
    ordered = tmp_path / 'ordered.bin'  # our order: by layer, then name
    infinitrain_save_lora_weights(ordered, sorted(tensors, key=lambda t: (int(t[0].split('.')[2]), t[0])))
    assert ours.read_bytes() == ordered.read_bytes()


def test_a_ddp_run_s_module_prefixed_file_loads(model, tmp_path):
    tensors = infinitrain_state_dict(2, DEFAULT_MODULES, SHAPES, rank=8, seed=3)
    prefixed = tmp_path / 'ddp.bin'  # b24d92f's LoRAStateDict of the DDP-wrapped model
    infinitrain_save_lora_weights(prefixed, [(f'module.{name}', array) for name, array in tensors])
    setup = _setup(model, lora_load_path=str(prefixed))
    attn = setup.lora_params['h']['attn']['c_attn']['lora_B']
    np.testing.assert_array_equal(np.asarray(attn[1]), dict(tensors)['transformer.h.1.attn.c_attn.lora_B'])


@pytest.mark.parametrize('family, tp', [('gpt2', 4), ('llama3', 2)])
def test_a_tp_gathered_pr150_file_loads_and_saves_back_byte_for_byte(tmp_path, family, tp):
    header = tiny_header(family)
    q_rows = header.channels  # Q is n_head · head_dim = C rows; K and V n_kv_head · head_dim
    kv_rows = q_rows * getattr(header, 'num_kv_heads', header.num_heads) // header.num_heads
    hidden = 4 * C if family == 'gpt2' else 96  # LLaMA-3: 2/3 of 4C rounded up to multiple_of 16
    shapes = {
        'attn.c_attn': (C, q_rows + 2 * kv_rows),
        'attn.c_proj': (C, C),
        'mlp.c_fc': (C, hidden),
        'mlp.c_fc2': (C, hidden),
        'mlp.c_proj': (hidden, C),
    }
    modules = tuple(m for m in shapes if family == 'llama3' or m != 'mlp.c_fc2')
    layers = 11 if family == 'gpt2' else 2  # from 11 layers on, sorted names put h.10 before h.2
    tensors = infinitrain_state_dict(layers, modules, shapes, rank=4, seed=5)
    theirs = tmp_path / 'pr150.bin'
    pr150_save_lora_weights(theirs, tensors, tp, q_rows)
    base = tiny_llmc_model(tmp_path / 'model.bin', family=family, num_layers=layers)
    targets = 'c_attn,c_proj,c_fc' + (',c_fc2' if family == 'llama3' else '')
    lora = {'lora_rank': 4, 'lora_target_modules': targets, 'lora_load_path': str(theirs)}
    setup = setup_model(load_config(family, llmc_filepath=base, **lora))
    ours = tmp_path / 'ours.bin'
    save_lora_weights(str(ours), setup.lora_params)  # master, the default
    assert ours.read_bytes() == theirs.read_bytes()
    whole = tmp_path / 'tp1.bin'  # the same adapters from a TP 1 run: the same file
    pr150_save_lora_weights(whole, tensors, 1, q_rows)
    assert whole.read_bytes() == theirs.read_bytes()
    if layers > 10:  # the head layout keeps layer order: other bytes
        head = tmp_path / 'head.bin'
        save_lora_weights(str(head), setup.lora_params, 'head')
        assert head.read_bytes() != theirs.read_bytes() and len(head.read_bytes()) == len(theirs.read_bytes())


def test_the_initial_adapters_round_trip(model, tmp_path):
    setup = _setup(model, lora_target_modules='c_attn,c_fc')
    path = tmp_path / 'init.bin'
    save_lora_weights(str(path), setup.lora_params)
    loaded = _setup(model, lora_target_modules='c_attn,c_fc', lora_load_path=str(path))
    for group in setup.lora_params['h']:
        for module, pair in setup.lora_params['h'][group].items():
            for which in pair:
                assert (
                    np.asarray(pair[which]).tobytes()
                    == np.asarray(loaded.lora_params['h'][group][module][which]).tobytes()
                )


@pytest.mark.parametrize(
    'tensors, says',
    [
        (
            lambda: infinitrain_state_dict(2, DEFAULT_MODULES, SHAPES, rank=4),
            'expected shape (8, 32) (rank 8), found (4, 32)',
        ),
        (
            lambda: infinitrain_state_dict(2, DEFAULT_MODULES + ('mlp.c_fc',), SHAPES, rank=8),
            'adapts mlp.c_fc, which',
        ),
        (
            lambda: infinitrain_state_dict(3, DEFAULT_MODULES, SHAPES, rank=8),
            'transformer.h.2.attn.c_attn.lora_A: not a LoRA tensor',
        ),
        (
            lambda: infinitrain_state_dict(2, DEFAULT_MODULES, SHAPES, rank=8)[1:],
            'missing, e.g. transformer.h.0.attn.c_attn.lora_A',
        ),
        (
            lambda: infinitrain_state_dict(2, DEFAULT_MODULES, {**SHAPES, 'attn.c_attn': (64, 192)}, rank=8),
            'expected shape (8, 32)',
        ),
    ],
)
def test_a_file_that_does_not_fit_is_one_line(model, tmp_path, tensors, says):
    path = tmp_path / 'bad.bin'
    infinitrain_save_lora_weights(path, tensors())
    with pytest.raises(ValueError) as error:
        _setup(model, lora_load_path=str(path))
    message = str(error.value)
    assert message.startswith(f'lora_load_path: {path}: ') and says in message and '\n' not in message


def test_a_damaged_file_is_one_line(model, tmp_path):
    good = tmp_path / 'good.bin'
    infinitrain_save_lora_weights(good, infinitrain_state_dict(2, DEFAULT_MODULES, SHAPES, rank=8))
    data = good.read_bytes()
    cases = {
        'truncated.bin': (data[:-5], 'truncated'),
        'magic.bin': (b'XXXX' + data[4:], 'magic'),
        'version.bin': (data[:4] + struct.pack('<I', 2) + data[8:], 'version'),
    }
    for name, (content, says) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError) as error:
            _setup(model, lora_load_path=str(tmp_path / name))
        assert str(error.value).startswith(f'lora_load_path: {tmp_path / name}: ') and says in str(
            error.value
        )
