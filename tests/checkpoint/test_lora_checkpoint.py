"""LoRA checkpoints (checkpoint/resume_checks.py): the seed's experiment with --lora_rank 8 on a
tiny GPT-2 llm.c file, bit for bit; the checkpoint holds adapters only and names its base;
a resume with another base file is refused naming both hashes; `ckpt show` says LoRA,
`verify` and `diff` work; `export --merge-lora` writes an llm.c file whose logits equal the
LoRA model's. Expectations come from outside the code under test: the llm.c file written
here, arrays read back through Orbax, hashlib, and a NumPy forward of the adapters."""

import functools
import hashlib
import json
import shutil
import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from trainer_runs import load_config, random_shard, restore_params, tiny_llmc_model, train

import llmc_io
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.models import FAMILIES
from jaxtrain.models.lora import LoRAParam, LoRASpec
from jaxtrain.tools import ckpt

LORA = dict(lora_rank=8, lora_alpha=16.0, lora_target_modules='c_attn,c_proj')


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp('lora_ckpt')
    shard = random_shard(root / 'train.bin')
    model = tiny_llmc_model(root / 'model.bin')
    common = dict(
        input_bin=shard,
        llmc_filepath=model,
        num_iteration=4,
        save_steps=2,
        max_checkpoint_keep=10,
        learning_rate=3e-3,
        **LORA,
    )
    full = load_config(
        'gpt2',
        checkpoint_dir=str(root / 'full'),
        metrics_dir=str(root / 'm1'),
        lora_save_path=str(root / 'adapters.bin'),
        **common,
    )
    code, full_losses, out = train(full)
    assert code == 0, out
    resumed = load_config(
        'gpt2',
        checkpoint_dir=str(root / 'resumed'),
        metrics_dir=str(root / 'm2'),
        resume_from=str(root / 'full' / 'checkpoint_step_000002'),
        **common,
    )
    code, resumed_losses, resumed_out = train(resumed)
    assert code == 0, resumed_out
    return dict(
        root=root,
        model=model,
        common=common,
        full_losses=full_losses,
        resumed_losses=resumed_losses,
        resumed_out=resumed_out,
        out=out,
    )


@pytest.mark.slow
def test_resumed_lora_run_matches_uninterrupted_bitwise(runs):
    full, resumed = runs['full_losses'], runs['resumed_losses']
    assert sorted(full) == list(range(1, 5)) and sorted(resumed) == [3, 4]
    assert [resumed[s] for s in (3, 4)] == [full[s] for s in (3, 4)]
    assert full[4] < full[1]  # the adapters learn
    assert 'restored step 2' in runs['resumed_out']
    a = restore_params(runs['root'] / 'full' / 'checkpoint_step_000004')
    b = restore_params(runs['root'] / 'resumed' / 'checkpoint_step_000004')
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_checkpoint_holds_adapters_and_names_the_base(runs):
    step_dir = runs['root'] / 'full' / 'checkpoint_step_000004'
    params = restore_params(step_dir)
    names = sorted(
        '/'.join(str(k.key) for k in p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
    )
    # c_proj selects both attn.c_proj and mlp.c_proj, as InfiniTrain's suffix match does.
    assert names == [f'h/{m}/lora_{w}' for m in ('attn/c_attn', 'attn/c_proj', 'mlp/c_proj') for w in 'AB']
    L, C, r = 2, 32, 8
    assert params['h']['attn']['c_attn']['lora_A'].shape == (L, r, C)
    assert params['h']['attn']['c_attn']['lora_B'].shape == (L, 3 * C, r)
    assert params['h']['mlp']['c_proj']['lora_A'].shape == (L, r, 4 * C)
    state = json.loads((step_dir / 'trainer_state' / 'metadata').read_text())
    assert state['llmc_file'] == runs['model']
    assert state['llmc_sha256'] == hashlib.sha256(Path(runs['model']).read_bytes()).hexdigest()
    assert state['lora']['rank'] == 8 and state['lora']['alpha'] == 16.0
    assert state['lora']['modules'] == ['attn.c_attn', 'attn.c_proj', 'mlp.c_proj']
    assert state['lora']['num_parameters'] == L * r * ((C + 3 * C) + (C + C) + (4 * C + C))


def test_resume_with_another_base_file_is_refused_naming_both_hashes(runs, tmp_path):
    other = tiny_llmc_model(tmp_path / 'other.bin', seed=1)
    config = load_config(
        'gpt2',
        checkpoint_dir=str(tmp_path / 'ck'),
        resume_from=str(runs['root'] / 'full' / 'checkpoint_step_000002'),
        **{**runs['common'], 'llmc_filepath': other},
    )
    with pytest.raises(CheckpointError) as error:
        train(config)
    message = str(error.value)
    assert '\n' not in message
    assert hashlib.sha256(Path(runs['model']).read_bytes()).hexdigest() in message
    assert hashlib.sha256(Path(other).read_bytes()).hexdigest() in message
    assert not (tmp_path / 'ck').exists() or not any((tmp_path / 'ck').iterdir())


def test_resume_with_other_lora_settings_is_refused(runs, tmp_path):
    step = str(runs['root'] / 'full' / 'checkpoint_step_000002')
    for change, named in (
        (dict(lora_rank=0), 'lora_rank'),
        (dict(lora_target_modules='c_attn'), 'lora_target_modules'),
    ):
        config = load_config('gpt2', resume_from=step, **{**runs['common'], 'save_steps': 0, **change})
        with pytest.raises(CheckpointError, match=named):
            train(config)


def test_ckpt_show_verify_diff(runs, capsys):
    step_dir = runs['root'] / 'full' / 'checkpoint_step_000004'
    assert ckpt.main(['show', str(step_dir)]) == 0
    shown = capsys.readouterr().out
    lora_line = next(line for line in shown.splitlines() if line.startswith('lora'))
    assert 'LoRA checkpoint: rank 8, alpha 16.0' in lora_line
    assert 'attn.c_attn, attn.c_proj, mlp.c_proj' in lora_line and '5,632 adapter parameters' in lora_line
    assert ckpt.main(['verify', str(step_dir)]) == 0
    assert 'OK' in capsys.readouterr().out
    other = runs['root'] / 'resumed' / 'checkpoint_step_000004'
    assert ckpt.main(['diff', str(step_dir), str(other)]) == 0  # bit-identical adapters and state
    # 6 adapters, Adam's mu and nu of each, and the two optimizer step counters
    assert 'tensors: 20 of 20 bit-identical' in capsys.readouterr().out


# The one batch shape the GPT-2 forwards here run at: each of the two models compiles once.
FORWARD_SHAPE = (2, 16)
GPT2_FIELDS = ('max_seq_len', 'vocab_size', 'padded_vocab_size', 'num_layers', 'num_heads', 'channels')


@functools.cache
def _forward(header, lora):
    """The jitted forward of the model of `header`, with adapters through LoRALinear when `lora`
    is a LoRASpec; one per model, so that repeated calls on one shape trace and compile once."""
    config = FAMILIES['gpt2'][1](**{k: getattr(header, k) for k in GPT2_FIELDS})
    abstract = nnx.eval_shape(lambda: FAMILIES['gpt2'][0](config, lora=lora, rngs=nnx.Rngs(0)))
    graphdef = nnx.split(abstract, nnx.Param, LoRAParam)[0] if lora else nnx.split(abstract, nnx.Param)[0]
    return jax.jit(lambda trees, t: nnx.merge(graphdef, *(nnx.State(x) for x in trees))(t))


def _logits(header, lora, trees, tokens):
    """The model's logits (jitted) with `trees` merged in: the base alone, or base and
    adapters through LoRALinear when `lora` is a LoRASpec."""
    return np.asarray(_forward(header, lora)(trees, jnp.asarray(tokens)))


def test_export_merge_lora_logits_equal_the_lora_model(runs, tmp_path, capsys):
    step_dir = runs['root'] / 'full' / 'checkpoint_step_000004'
    out = tmp_path / 'merged.bin'
    assert ckpt.main(['export', str(step_dir), '--output', str(out)]) == 2  # refused without merging
    error = capsys.readouterr().err
    assert '--merge-lora' in error and len(error.strip().splitlines()) == 1 and not out.exists()
    assert ckpt.main(['export', str(step_dir), '--output', str(out), '--merge-lora']) == 0
    capsys.readouterr()

    base_header, base = llmc_io.load_gpt2(runs['model'])
    merged_header, merged = llmc_io.load_gpt2(str(out))
    assert merged_header == base_header
    # Only the adapted kernels changed; the tied head (wte) and everything else are the base's bits.
    flat = lambda t: {
        '/'.join(str(k.key) for k in p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(t)[0]
    }
    fb, fm = flat(base), flat(merged)
    changed = sorted(n for n in fb if fb[n].tobytes() != fm[n].tobytes())
    assert changed == ['h/attn/c_attn/kernel', 'h/attn/c_proj/kernel', 'h/mlp/c_proj/kernel']

    adapters = restore_params(step_dir)
    tokens = np.random.default_rng(0).integers(0, 512, FORWARD_SHAPE)
    lora = LoRASpec(8, 16.0, ('c_attn', 'c_proj'), ('attn.c_attn', 'attn.c_proj', 'mlp.c_proj'))
    lora_logits = _logits(base_header, lora, (base, adapters), tokens)
    merged_logits = _logits(base_header, None, (merged,), tokens)
    assert np.abs(lora_logits - merged_logits).max() <= 1e-5
    # The adapters matter: the base model's logits differ from both.
    base_logits = _logits(base_header, None, (base,), tokens)
    assert np.abs(base_logits - lora_logits).max() > 1e-4

    # A moved base is found with --base; a different file is refused with both hashes.
    moved = tmp_path / 'moved.bin'
    shutil.copy(runs['model'], moved)
    assert (
        ckpt.main(
            [
                'export',
                str(step_dir),
                '--output',
                str(tmp_path / 'm2.bin'),
                '--merge-lora',
                '--base',
                str(moved),
            ]
        )
        == 0
    )
    assert (tmp_path / 'm2.bin').read_bytes() == out.read_bytes()
    wrong = tiny_llmc_model(tmp_path / 'wrong.bin', seed=3)
    assert (
        ckpt.main(
            ['export', str(step_dir), '--output', str(tmp_path / 'm3.bin'), '--merge-lora', '--base', wrong]
        )
        == 2
    )
    error = capsys.readouterr().err
    assert (
        hashlib.sha256(Path(wrong).read_bytes()).hexdigest() in error and not (tmp_path / 'm3.bin').exists()
    )


# Builds and compiles `small` (16M parameters): about 60 s on 2 busy cores. XLA's optimizations
# halve the step of a model this size and cost less compile than they save.
@pytest.mark.slow
@pytest.mark.xla_optimized
def test_lora_checkpoint_of_small_is_over_10x_smaller_than_a_full_one(tmp_path):
    """`small` (4 layers, C 256, the GPT-2 vocabulary) from its random init, one step, saved.
    A full checkpoint holds at least the fp32 params and AdamW's two moments of each."""
    from jaxtrain.models.gpt2 import VARIANTS

    config = load_config(
        'gpt2',
        'small',
        input_bin=random_shard(tmp_path / 'train.bin'),
        num_iteration=1,
        save_steps=1,
        checkpoint_dir=str(tmp_path / 'ck'),
        lora_rank=8,
    )
    code, _, out = train(config)
    assert code == 0, out
    step_dir = tmp_path / 'ck' / 'checkpoint_step_000001'
    lora_bytes = sum(p.stat().st_size for p in step_dir.rglob('*') if p.is_file())
    full_lower_bound = 3 * 4 * VARIANTS['small'].num_parameters
    assert lora_bytes * 10 <= full_lower_bound, (lora_bytes, full_lower_bound)


def test_lora_save_path_writes_the_final_adapters(runs):
    """InfiniTrain's --lora_save_path after the last step; read back with --lora_load_path."""
    from jaxtrain.models.setup import setup_model

    assert f"lora_save_path: wrote 12 LoRA tensors to {runs['root'] / 'adapters.bin'}" in runs['out']
    loaded = setup_model(
        load_config(
            'gpt2', llmc_filepath=runs['model'], lora_load_path=str(runs['root'] / 'adapters.bin'), **LORA
        )
    ).lora_params
    final = restore_params(runs['root'] / 'full' / 'checkpoint_step_000004')
    for x, y in zip(jax.tree.leaves(final), jax.tree.leaves(loaded), strict=True):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@pytest.mark.slow
def test_llama3_export_merge_lora(tmp_path, capsys):
    """LLaMA-3 (untied lm_head, SwiGLU's c_fc/c_fc2): a LoRA checkpoint written through the
    trainer's Checkpointer with random, nonzero adapters on every projection; its merged
    export gives the LoRA model's logits."""
    import dataclasses

    from jaxtrain.checkpoint.resume_checks import lora_record
    from jaxtrain.checkpoint.manager import Checkpointer
    from jaxtrain.models.lora import count_parameters
    from jaxtrain.models.setup import setup_model

    model = tiny_llmc_model(tmp_path / 'llama.bin', 'llama3')
    config = load_config(
        'llama3',
        llmc_filepath=model,
        lora_rank=4,
        lora_alpha=8.0,
        lora_target_modules='c_attn,c_proj,c_fc,c_fc2',
    )
    setup = setup_model(config)
    rng = np.random.default_rng(0)
    adapters = jax.tree.map(
        lambda x: (0.05 * rng.standard_normal(x.shape)).astype(np.float32), setup.lora_params
    )
    record = {
        'step': 1,
        'data_position': 1,
        'model_family': 'llama3',
        'model_config': dataclasses.asdict(setup.model_config),
        'training_config': config.to_dict(),
        'llmc_file': model,
        'llmc_sha256': hashlib.sha256(Path(model).read_bytes()).hexdigest(),
        'has_optimizer_state': False,
        'lora': lora_record(setup, count_parameters(adapters)),
    }
    checkpointer = Checkpointer(str(tmp_path / 'ck'), keep_latest=0, keep_every=0)
    checkpointer.save(1, jax.device_put(adapters), None, jax.random.key_data(jax.random.PRNGKey(0)), record)
    checkpointer.close()
    step_dir = tmp_path / 'ck' / 'checkpoint_step_000001'
    out = tmp_path / 'merged.bin'
    assert ckpt.main(['export', str(step_dir), '--output', str(out), '--merge-lora']) == 0, (
        capsys.readouterr().err
    )

    model_cls = FAMILIES['llama3'][0]
    abstract = nnx.eval_shape(lambda: model_cls(setup.model_config, lora=setup.lora, rngs=nnx.Rngs(0)))
    lora_graph = nnx.split(abstract, nnx.Param, LoRAParam)[0]
    plain_graph = nnx.split(
        nnx.eval_shape(lambda: model_cls(setup.model_config, rngs=nnx.Rngs(0))), nnx.Param
    )[0]
    forward = lambda graph: jax.jit(lambda trees, t: nnx.merge(graph, *(nnx.State(x) for x in trees))(t))
    tokens = jnp.asarray(rng.integers(0, 512, (2, 16)))
    base, merged = llmc_io.load_llama3(model)[1], llmc_io.load_llama3(str(out))[1]
    lora_logits = np.asarray(forward(lora_graph)((base, adapters), tokens))
    merged_logits = np.asarray(forward(plain_graph)((merged,), tokens))
    assert np.abs(lora_logits - merged_logits).max() <= 1e-5
    assert (
        np.asarray(base['lm_head']['kernel']).tobytes() == np.asarray(merged['lm_head']['kernel']).tobytes()
    )
    assert not np.array_equal(base['h']['mlp']['c_fc2']['kernel'], merged['h']['mlp']['c_fc2']['kernel'])


@pytest.mark.slow
def test_generate_from_a_lora_checkpoint_applies_the_adapters_to_its_base(runs, capsys):
    """`generate --checkpoint` on adapters only: greedy tokens are those of the LoRA model (the
    base file plus the adapters through LoRALinear, not a merge), which the base alone does not give."""
    from jaxtrain.tools import generate

    step_dir = runs['root'] / 'full' / 'checkpoint_step_000004'
    base_header, base = llmc_io.load_gpt2(runs['model'])
    adapters = restore_params(step_dir)
    lora = LoRASpec(8, 16.0, ('c_attn', 'c_proj'), ('attn.c_attn', 'attn.c_proj', 'mlp.c_proj'))

    def greedy(trees, spec, prompt, new):
        tokens = list(prompt)
        rows, width = FORWARD_SHAPE
        assert len(prompt) + new <= width
        for _ in range(new):  # causal: padding after the last token leaves its logits alone (one compile)
            padded = np.array([tokens + [0] * (width - len(tokens))] * rows)
            logits = _logits(base_header, spec, trees, padded)[0, len(tokens) - 1, : base_header.vocab_size]
            tokens.append(int(np.argmax(logits)))
        return tokens[len(prompt) :]

    prompt, new = [7, 11, 12], 8
    expected = greedy((base, adapters), lora, prompt, new)
    assert expected != greedy((base,), None, prompt, new)  # the adapters change what is generated
    args = ['--prompt_ids', ','.join(map(str, prompt)), '--max_new_tokens', str(new), '--temperature', '0']
    for moved in ([], ['--base', runs['model']]):
        assert generate.main(['--checkpoint', str(step_dir), *args, *moved]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert f"(LoRA rank 8 on {runs['model']})" in out
        assert out.split('--- sample 1/1\n')[1].split('\n')[0] == ' '.join(map(str, expected)), out


def test_lora_on_a_random_init_base_generates_exports_and_resumes(tmp_path, capsys):
    """A LoRA checkpoint whose base is tiny's random init of seed 3 (no llm.c file), written by the
    trainer's Checkpointer with random, nonzero adapters: generate decodes the base with them folded in
    (NumPy's fold and forward), export --merge-lora writes the same weights, a resume's checks pass;
    a recorded base hash that the seed no longer gives is refused by each, naming both hashes."""
    import dataclasses

    import numpy_reference as ref
    from trainer_runs import write_checkpoint

    from jaxtrain.checkpoint.resume_checks import lora_record, resume_problems
    from jaxtrain.models.lora import count_parameters
    from jaxtrain.models.setup import setup_model
    from jaxtrain.tools import generate

    config = load_config('gpt2', 'tiny', seed=3, lora_rank=4, lora_alpha=8.0)
    setup = setup_model(config)
    rng = np.random.default_rng(0)
    adapters = jax.tree.map(
        lambda x: (0.2 * rng.standard_normal(x.shape)).astype(np.float32), setup.lora_params
    )
    record = dict(
        model_config=dataclasses.asdict(setup.model_config),
        training_config=config.to_dict(),
        lora=lora_record(setup, count_parameters(adapters)),
    )
    step_dir = write_checkpoint(tmp_path / 'ck', 1, 'gpt2', setup.model_config, adapters, **record)
    merged = jax.tree.map(lambda x: np.array(x, np.float32), setup.params)
    for module in ('attn/c_attn', 'attn/c_proj', 'mlp/c_proj'):  # W + (alpha/r) (B A)^T per layer
        group, name = module.split('/')
        pair = adapters['h'][group][name]
        delta = np.einsum('lri,lor->lio', pair['lora_A'], pair['lora_B'])
        merged['h'][group][name]['kernel'] = merged['h'][group][name]['kernel'] + 2.0 * delta

    def reference_greedy(params):
        tokens = [7, 11]
        for _ in range(4):
            logits = ref.gpt2_logits(params, 4, np.array([tokens]))[0, -1, : setup.model_config.vocab_size]
            tokens.append(int(np.argmax(logits)))
        return tokens

    tokens = reference_greedy(merged)
    assert tokens != reference_greedy(setup.params)  # the adapters change what is generated
    pieces = [f'<{i}>'.encode() for i in range(setup.model_config.vocab_size)]  # shows the ids
    header = struct.pack('<256i', *([20240328, 2, len(pieces), 50256] + [0] * 252))
    (tmp_path / 'ids.bin').write_bytes(header + b''.join(bytes([len(p)]) + p for p in pieces))
    greedy = [
        '--tokenizer_bin',
        str(tmp_path / 'ids.bin'),
        '--checkpoint',
        str(step_dir),
        '--prompt_ids',
        '7,11',
        '--max_new_tokens',
        '4',
        '--temperature',
        '0',
    ]
    assert generate.main(greedy) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert '(LoRA rank 4 on the random init of its seed)' in out
    assert out.split('--- sample 1/1\n')[1].split('\n')[0] == ''.join(f'<{i}>' for i in tokens), out
    assert ckpt.main(['export', str(step_dir), '--output', str(tmp_path / 'merged.bin'), '--merge-lora']) == 0
    exported = llmc_io.load_gpt2(str(tmp_path / 'merged.bin'))[1]
    for path, leaf in jax.tree_util.tree_flatten_with_path(merged)[0]:
        found = exported
        for key in path:
            found = found[key.key]
        np.testing.assert_allclose(found, leaf, atol=1e-6)
    assert (
        resume_problems(json.loads((step_dir / 'trainer_state' / 'metadata').read_text()), config, setup)
        == []
    )

    # Another platform's draw of the seed: refused everywhere with one line naming both hashes.
    recorded = record['lora']['base_sha256']
    tampered = dict(record, lora={**record['lora'], 'base_sha256': '0' * 64})
    other = write_checkpoint(tmp_path / 'other', 1, 'gpt2', setup.model_config, adapters, **tampered)
    assert generate.main([*greedy[:3], str(other), *greedy[4:]]) == 2
    assert ckpt.main(['export', str(other), '--output', str(tmp_path / 'm2.bin'), '--merge-lora']) == 2
    for error in capsys.readouterr().err.strip().splitlines():
        assert '0' * 64 in error and recorded in error, error
    problems = resume_problems(tampered, config, setup)
    assert len(problems) == 1 and '0' * 64 in problems[0] and recorded in problems[0]
