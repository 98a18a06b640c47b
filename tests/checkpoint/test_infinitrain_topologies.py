"""Multi-GPU InfiniTrain step directories, both directions, for every topology upstream has.

Read: the real one-rank samples (../shared/infinitrain head-gpt2, head-llama3) are laid out as a run of each
topology would save them, by tests/infinitrain_rank_fixtures.py (a writer that follows upstream's code rule
by rule, apart from llmc_io), and jaxtrain's reader must give back the sample's tensors bit for bit.
Write: `ckpt export --format infinitrain --ddp/--tp/--pp/--vpp/--zero_stage` must lay out, rank for rank,
the same tensors under the same names as that writer, and read back to the same state.
Bad input: missing, duplicated and disagreeing rank directories, and shards that do not add up.
"""

import shutil

import numpy as np
import pytest
from infinitrain_rank_fixtures import write_run
from infinitrain_samples import needs_samples, saved_step_tensors, unpacked

from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain import writer
from llmc_io.infinitrain import layout
from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.state import read_trainer_state
from llmc_io.infinitrain.topology import Topology, chunk_ranges
from llmc_io.infinitrain.statedict import read_state_dict
from llmc_io.tensors import tree_leaves

# (ddp, tp, pp, vpp, zero_stage, sequence_parallel[, cp]); at most 8 ranks, as on the 8 fake devices.
# A 7th entry is d03ba16's --context_parallel (rank order, ZeRO group: tests/infinitrain_rank_fixtures.py)
GPT2_TOPOLOGIES = [
    (2, 1, 1, 1, 0, False),
    (8, 1, 1, 1, 0, False),
    (1, 2, 1, 1, 0, False),
    (1, 4, 1, 1, 0, True),
    (1, 1, 2, 1, 0, False),
    (2, 2, 2, 1, 0, True),
    (1, 2, 1, 1, 0, True, 2),
    (2, 1, 1, 1, 0, False, 2),
]
LLAMA3_TOPOLOGIES = [  # head-llama3 has one key/value head, so TP must be 1 (causal_self_attention.cc:67)
    (2, 1, 1, 1, 0, False),
    (2, 1, 1, 1, 1, False),
    (8, 1, 1, 1, 2, False),
    (1, 1, 2, 1, 0, False),
    (4, 1, 2, 1, 1, False),
    (2, 1, 2, 1, 2, False),
    (1, 1, 2, 1, 1, False, 2),
    (2, 1, 1, 1, 2, False, 4),
]
SYNTHETIC_TOPOLOGIES = [  # LLaMA-3 with 4 layers and 2 key/value heads: TP with GQA, virtual stages, ZeRO
    (1, 2, 1, 1, 0, False),
    (2, 2, 2, 1, 1, True),
    (1, 2, 2, 2, 0, False),
    (2, 1, 2, 2, 2, False),
    (2, 2, 2, 1, 2, False),
    (2, 2, 1, 1, 1, False, 2),
    (1, 2, 2, 2, 0, True, 2),
]


def _ids(v):
    """'ddp2-tp2-pp1-vpp1-zero1[-sp][-cp2]'."""
    if isinstance(v, str):
        return v
    cp = f'-cp{v[6]}' if len(v) > 6 else ''
    return 'ddp{}-tp{}-pp{}-vpp{}-zero{}'.format(*v[:5]) + '-sp' * v[5] + cp


@pytest.fixture(scope='module')
def real():
    return unpacked()  # read only: a test damages its own copy


def _sample(real, folder):
    """(family, {name: array} model, {name: (m, v)} or None, adam t, the reader's view) of a real step."""
    step = real / folder / 'a' / 'checkpoint_step_000010'
    return *saved_step_tensors(step), it.read_checkpoint(step)


def _same_bits(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k, value in a.items():
        assert value.dtype == b[k].dtype and value.shape == b[k].shape, k
        assert np.array_equal(value.reshape(-1).view(np.uint8), b[k].reshape(-1).view(np.uint8)), k


def _same_checkpoint(got, want):
    _same_bits(tree_leaves(got.params), tree_leaves(want.params))
    if want.moments is None:
        assert got.moments is None
        return
    for g, w in zip(got.moments[:2], want.moments[:2], strict=True):
        _same_bits(tree_leaves(g), tree_leaves(w))
    assert got.moments[2] == want.moments[2]


def _rank_tensors(step_dir):
    """{rank dir name: {file: {name: array}}} of a multi-rank step."""
    out = {}
    for rank in sorted(step_dir.glob('rank_*')):
        out[rank.name] = {
            f.name: {n: t.array for n, t in read_state_dict(f).items()} for f in sorted(rank.glob('*.ckpt'))
        }
    return out


@needs_samples
@pytest.mark.parametrize(
    'folder,topology',
    [('head-gpt2', t) for t in GPT2_TOPOLOGIES] + [('head-llama3', t) for t in LLAMA3_TOPOLOGIES],
    ids=_ids,
)
def test_real_sample_split_by_upstreams_rules_reads_back_bit_for_bit(real, tmp_path, folder, topology):
    ddp, tp, pp, vpp, zero, sp, *context = topology
    cp = context[0] if context else None
    family, model, adam, t, want = _sample(real, folder)
    split = write_run(
        tmp_path / 'split' / 'checkpoint_step_000010',
        family,
        model,
        adam,
        t,
        step=10,
        consumed=10,
        lr=0.01,
        ddp=ddp,
        tp=tp,
        pp=pp,
        vpp=vpp,
        zero_stage=zero,
        sequence_parallel=sp,
        cp=cp,
    )
    got = it.read_checkpoint(split, vpp=vpp if vpp > 1 else None)
    _same_checkpoint(got, want)
    ranks = ddp * tp * pp * (cp or 1)
    assert got.ranks == ranks and got.state.global_step == 10 and got.state.data_batch_idx == 10
    assert (got.topology.ddp, got.topology.tp, got.topology.pp, got.topology.sequence_parallel) == (
        ddp,
        tp,
        pp,
        sp,
    )
    assert got.topology.cp == (cp or 1) and got.state.cp_size == cp
    assert got.topology.zero_stage == (1 if zero else 0)  # ZeRO-1 and -2 write the same shards


def _synthetic(seed=0):
    """A 4-layer LLaMA-3 (C=16, 4 query heads, 2 key/value heads of 4, FFN 24, V=64) with Adam state."""
    rng = np.random.default_rng(seed)
    c, kv_rows, ffn, vocab = 16, 8, 24, 64
    shapes = {
        'transformer.wte.weight': (vocab, c),
        'transformer.ln_f.weight': (c,),
        'lm_head.weight': (vocab, c),
    }
    for i in range(4):
        shapes.update(
            {
                f'transformer.h.{i}.ln_1.weight': (c,),
                f'transformer.h.{i}.attn.c_attn.weight': (c + 2 * kv_rows, c),
                f'transformer.h.{i}.attn.c_proj.weight': (c, c),
                f'transformer.h.{i}.ln_2.weight': (c,),
                f'transformer.h.{i}.mlp.c_fc.weight': (ffn, c),
                f'transformer.h.{i}.mlp.c_fc2.weight': (ffn, c),
                f'transformer.h.{i}.mlp.c_proj.weight': (c, ffn),
            }
        )
    model = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    adam = {
        n: (rng.standard_normal(s).astype(np.float32), rng.random(s).astype(np.float32))
        for n, s in shapes.items()
    }
    return model, adam


@pytest.mark.parametrize('topology', SYNTHETIC_TOPOLOGIES, ids=_ids)
def test_export_lays_out_what_upstream_saves_and_reads_back(tmp_path, topology):
    ddp, tp, pp, vpp, zero, sp, *context = topology
    cp = context[0] if context else None
    model, adam = _synthetic()
    fixture = write_run(
        tmp_path / 'upstream' / 'checkpoint_step_000007',
        'llama3',
        model,
        adam,
        7,
        step=7,
        consumed=7,
        lr=0.01,
        ddp=ddp,
        tp=tp,
        pp=pp,
        vpp=vpp,
        zero_stage=zero,
        sequence_parallel=sp,
        cp=cp,
    )
    read = it.read_checkpoint(fixture, vpp=vpp)
    # the reader's trees, written back for the same topology through the export path
    header = _Header()
    exported = tmp_path / 'ours' / 'checkpoint_step_000007'
    writer.write_checkpoint(
        exported,
        it.HEAD_KIND,
        'llama3',
        read.params,
        header,
        read.moments,
        read.state,
        topology=Topology(ddp, tp, pp, vpp, sp, zero, cp or 1),
    )
    assert _rank_tensors(exported).keys() == _rank_tensors(fixture).keys()
    for rank, files in _rank_tensors(fixture).items():
        ours = _rank_tensors(exported)[rank]
        assert ours.keys() == files.keys()
        for f in files:
            _same_bits(ours[f], files[f])
        state = read_trainer_state(exported / rank / 'trainer_state.json')
        theirs = read_trainer_state(fixture / rank / 'trainer_state.json')
        assert (state.ddp_size, state.tp_size, state.sp_size, state.pp_size, state.data_batch_idx) == (
            theirs.ddp_size,
            theirs.tp_size,
            theirs.sp_size,
            theirs.pp_size,
            theirs.data_batch_idx,
        )
        assert state.cp_size == theirs.cp_size
    _same_checkpoint(it.read_checkpoint(exported, vpp=vpp), read)
    # the per-rank entry order is upstream's unordered_map order of that stage (llmc_io/infinitrain/layout.py)
    rank0 = list(read_state_dict(exported / 'rank_000000' / 'model.ckpt'))
    chunks = tuple(b - a for a, b in sorted(chunk_ranges(4, pp, 0, vpp)))
    prefixed = ddp * (cp or 1) > 1 or pp > 1
    assert tuple(rank0) == layout.stage_orders('llama3', chunks, True, pp == 1, prefixed)[0]


class _Header:
    """What write_checkpoint takes from a header for LLaMA-3 rank directories."""

    vocab_size = padded_vocab_size = 64
    max_seq_len = 64
    num_heads, num_kv_heads = 4, 2


def _bad_input_cases():
    def drop_rank(step):
        shutil.rmtree(step / 'rank_000003')

    def duplicate_rank(step):
        shutil.copytree(step / 'rank_000001', step / 'rank_0000001')

    def step_disagrees(step):
        path = step / 'rank_000002' / 'trainer_state.json'
        path.write_text(path.read_text().replace('"global_step": 7', '"global_step": 6'))

    def topology_disagrees(step):
        path = step / 'rank_000001' / 'trainer_state.json'
        path.write_text(path.read_text().replace('"pp_size": 2', '"pp_size": 1'))

    def piece_too_short(step):
        from llmc_io.infinitrain.statedict import CkptTensor, write_state_dict

        path = step / 'rank_000001' / 'optimizer.ckpt'
        tensors = read_state_dict(path)
        tensors['adam.m.0'] = CkptTensor(tensors['adam.m.0'].dtype, tensors['adam.m.0'].array[:-1])
        write_state_dict(path, tensors)

    def context_parallel(step):
        for rank in step.glob('rank_*'):
            path = rank / 'trainer_state.json'
            path.write_text(path.read_text().replace('"pp_size"', '"cp_size": 2,\n  "pp_size"'))

    def slice_too_wide(step):
        from llmc_io.infinitrain.statedict import CkptTensor, write_state_dict

        path = step / 'rank_000000' / 'model.ckpt'
        tensors = read_state_dict(path)
        name = 'module.transformer.h.0.mlp.c_fc.weight'
        tensors[name] = CkptTensor(tensors[name].dtype, np.concatenate([tensors[name].array] * 2))
        write_state_dict(path, tensors)

    return {
        drop_rank: r'step_000007: rank directories: expected ddp x tp x pp = 2 x 1 x 2 = 4 .*found 3',
        duplicate_rank: r'step_000007: rank 1: expected one directory, found 2 \(rank_0000001, rank_000001\)',
        step_disagrees: r'000002/trainer_state.json: global_step: expected 7 \(as rank_000000\), found 6',
        topology_disagrees: r'000001/trainer_state.json: pp_size: expected 2 \(as rank_000000\), found 1',
        piece_too_short: r"rank_000001/optimizer.ckpt: tensor 'adam.m.0' shape: expected \(\d+,\) \(shard 1",
        slice_too_wide: r"c_fc.weight' shape: expected .*TP rank",
        # cp_size 2 (d03ba16) doubles the ranks the four directories must be
        context_parallel: r'rank directories: expected ddp x tp x cp x pp = 2 x 1 x 2 x 2 = 8 .*found 4',
    }


@pytest.mark.parametrize(
    'damage,message', list(_bad_input_cases().items()), ids=lambda v: getattr(v, '__name__', '')
)
def test_bad_rank_directories_are_one_line_and_nothing_is_written(tmp_path, capsys, damage, message):
    from jaxtrain.tools import ckpt

    model, adam = _synthetic()
    step = write_run(
        tmp_path / 'run' / 'checkpoint_step_000007',
        'llama3',
        model,
        adam,
        7,
        step=7,
        consumed=7,
        lr=0.01,
        ddp=2,
        tp=1,
        pp=2,
        zero_stage=1,
    )
    if damage.__name__ == 'slice_too_wide':
        step = tmp_path / 'tp' / 'checkpoint_step_000007'
        write_run(step, 'llama3', model, adam, 7, step=7, consumed=7, lr=0.01, ddp=1, tp=2, pp=2)
    damage(step)
    with pytest.raises(LLMCFormatError, match=message):
        it.read_checkpoint(step)
    out_dir = tmp_path / 'out' / 'checkpoint_step_000007'
    code = ckpt.main(['export', str(step), '--format', 'infinitrain', '--ddp', '2', '--output', str(out_dir)])
    out, err = capsys.readouterr()
    assert code == 2 and out == '' and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / 'out').exists() or not any((tmp_path / 'out').iterdir())


@needs_samples
def test_ckpt_export_for_a_topology_diffs_identical_to_its_source(real, tmp_path, capsys):
    from jaxtrain.tools import ckpt

    src = real / 'pr-llama3' / 'a' / 'checkpoint_step_000010'  # the PR's model.bin carries the model shape
    out = tmp_path / 'ranks' / 'checkpoint_step_000010'
    argv = ['export', src, '--format', 'infinitrain', '--ddp', '2', '--pp', '2', '--zero_stage', '1']
    code = ckpt.main([str(a) for a in argv + ['--output', out]])
    printed, err = capsys.readouterr()
    assert code == 0, err
    assert 'as 4 rank directories (ddp 2 x tp 1 x pp 2, ZeRO-1)' in printed
    assert '--nthread_per_process 4 --pipeline_parallel 2 --zero_stage 1 --load' in printed
    assert sorted(p.name for p in out.iterdir()) == [f'rank_{r:06d}' for r in range(4)]
    assert ckpt.main(['diff', str(src), str(out)]) == 0, capsys.readouterr()
    assert 'identical' in capsys.readouterr().out
    assert ckpt.main(['verify', str(out)]) == 0, capsys.readouterr()
    # one key/value head cannot be split over two TP ranks (causal_self_attention.cc:67): refused, not written
    bad = tmp_path / 'tp2' / 'checkpoint_step_000010'
    code = ckpt.main([str(a) for a in argv[:4] + ['--tp', '2', '--output', bad]])
    _, err = capsys.readouterr()
    assert code == 2 and 'n_kv_head: expected a multiple of --tp 2, found 1' in err and not bad.exists()
    code = ckpt.main([str(a) for a in argv[:4] + ['--zero_stage', '1', '--output', bad]])
    _, err = capsys.readouterr()
    assert code == 2 and '--zero_stage: expected 0 with --ddp 1' in err and not bad.exists()


def test_zero_pieces_of_models_with_several_buckets():
    """Buckets close at 1e6 elements (distributed_data_parallel_config.h:62): GPT-2 124M's parameter sizes
    make many. The pieces equal the fixture writer's transcription of upstream and cover every element of
    every parameter exactly once over the DDP ranks, for DDP sizes that do and do not divide 128."""
    from infinitrain_rank_fixtures import _zero_pieces

    from llmc_io.infinitrain.topology import pieces

    c, v, t = 768, 50304, 1024
    layer = [
        ('ln_1.weight', c), ('ln_1.bias', c), ('attn.c_attn.weight', 3 * c * c), ('attn.c_attn.bias', 3 * c),
        ('attn.c_proj.weight', c * c), ('attn.c_proj.bias', c), ('ln_2.weight', c), ('ln_2.bias', c),
        ('mlp.c_fc.weight', 4 * c * c), ('mlp.c_fc.bias', 4 * c), ('mlp.c_proj.weight', 4 * c * c),
        ('mlp.c_proj.bias', c),
    ]  # fmt: skip
    params = [('wte', v * c), ('wpe', t * c)]
    params += [(f'h.{i}.{n}', k) for i in range(12) for n, k in layer]
    params += [('ln_f.weight', c), ('ln_f.bias', c)]
    chunks = [params[:80], params[80:]]  # two DDP-wrapped chunks, as with virtual pipeline stages
    for ddp in (2, 3, 8):
        covered = {name: np.zeros(numel, np.int8) for name, numel in params}
        for rank in range(ddp):
            ours = [(p.name, p.start, p.stop) for p in pieces(chunks, ddp, rank)]
            assert ours == _zero_pieces(chunks, ddp, rank)
            for name, start, stop in ours:
                covered[name][start:stop] += 1
        assert all((c == 1).all() for c in covered.values()), ddp


def test_virtual_stages_the_files_cannot_tell_apart(tmp_path):
    """4 layers on 2 stages hold 2 + 2 layers with --virtual_pipeline_parallel 1 (layers 0,1 | 2,3) and
    with 2 (0,2 | 1,3): trainer_state.json does not say which. Without a hint 1 is taken and said; the
    resuming run's own --pipeline_parallel 2 --virtual_pipeline_parallel 2 (what an InfiniTrain user
    passes again) or vpp= picks 2; a hint from another pp is not used."""
    model, adam = _synthetic()
    step = write_run(
        tmp_path / 'checkpoint_step_000007', 'llama3', model, adam, 7, step=7, consumed=7, lr=0.01,
        pp=2, vpp=2,
    )  # fmt: skip
    want = _synthetic_tree(tmp_path, model, adam)
    guessed = it.read_checkpoint(step)
    assert any("its stages fit [1, 2], so 1 (upstream's default) is assumed" in n for n in guessed.notices)
    assert not np.array_equal(guessed.params['h']['ln_1']['scale'], want.params['h']['ln_1']['scale'])
    for hinted in (it.read_checkpoint(step, run_pipeline=(2, 2)), it.read_checkpoint(step, vpp=2)):
        _same_checkpoint(hinted, want)
    assert it.read_checkpoint(step, run_pipeline=(4, 2)).topology.vpp == 1


def _synthetic_tree(tmp_path, model, adam):
    """The synthetic model read back from one rank (the single-GPU layout of the same tensors)."""
    step = write_run(
        tmp_path / 'two' / 'checkpoint_step_000007', 'llama3', model, adam, 7, step=7, consumed=7, lr=0.01,
        ddp=2,
    )  # fmt: skip
    return it.read_checkpoint(step)


def test_verify_compares_the_data_parallel_replicas(tmp_path, capsys):
    from jaxtrain.tools import ckpt
    from llmc_io.infinitrain.statedict import CkptTensor, write_state_dict

    model, adam = _synthetic()
    step = write_run(
        tmp_path / 'checkpoint_step_000007', 'llama3', model, adam, 7, step=7, consumed=7, lr=0.01,
        ddp=2, pp=2, zero_stage=1,
    )  # fmt: skip
    assert ckpt.main(['verify', str(step)]) == 0
    assert 'weights of the 2 data-parallel replicas bit-identical' in capsys.readouterr().out
    path = step / 'rank_000003' / 'model.ckpt'  # dp 1 of the second stage
    tensors = read_state_dict(path)
    name = 'module.transformer.ln_f.weight'
    tensors[name] = CkptTensor(tensors[name].dtype, tensors[name].array + 1)
    write_state_dict(path, tensors)
    assert ckpt.main(['verify', str(step)]) == 1
    out = capsys.readouterr().out
    assert f"rank_000003/model.ckpt: tensor '{name}': expected the bytes of data-parallel rank 0" in out
    assert '(rank_000002), found different values' in out


@pytest.mark.parametrize(
    'name, expected',
    [
        ('transformer.ln_f.weight', 'the same on every TP rank (not split by tensor parallelism)'),
        ('lm_head.weight', 'the same slice shape on every TP rank'),
    ],
)
def test_tp_ranks_of_unequal_shapes_are_one_line(name, expected):
    from llmc_io.infinitrain.topology import tp_merge

    parts = [np.zeros((4, 8), np.float32), np.zeros((2, 8), np.float32)]
    with pytest.raises(LLMCFormatError) as error:
        tp_merge('step/rank_000001', name, parts, n_embd=8)
    message = str(error.value)
    assert f"tensor '{name}' shape" in message and expected in message and '(4, 8) / (2, 8)' in message
    assert 'different runs' in message and '\n' not in message
