"""Every InfiniTrain flag is accepted: honoured, or (for a feature another issue builds)
refused on one line with "not supported yet" when given a value other than upstream's
default. The list of flags is transcribed here from upstream, independently of
jaxtrain/config/infinitrain_flags.py, and the two are compared."""

import pytest

from cli_runs import run_cli
from trainer_runs import random_shard, tiny_llmc_model

# example/gpt2/main.cc and example/llama3/main.cc at InfiniTensor/InfiniTrain
# b24d92f280dd5f46d6c0eee97230d9fcffc70785 (HEAD), their DEFINE_* lines in order:
# name -> (gflags type, gpt2 default, llama3 default).
HEAD_FLAGS = {
    'input_bin': ('string', '', ''),
    'input_val_bin': ('string', '', ''),
    'tokenizer_bin': ('string', '', ''),
    'llmc_filepath': ('string', '', ''),
    'model': ('string', 'gpt2', 'llama3'),
    'batch_size': ('uint32', 4, 4),
    'sequence_length': ('uint32', 64, 64),
    'total_batch_size': ('uint32', 256, 256),
    'num_iteration': ('uint32', 10, 10),
    'freq_generate_txt': ('uint32', 10, 10),
    'text_length': ('uint32', 64, 64),
    'learning_rate': ('double', 1e-4, 1e-5),
    'zero_stage': ('int32', 0, 0),
    'val_loss_every': ('uint32', 0, 0),
    'sample_every': ('uint32', 0, 0),
    'overfit_single_batch': ('bool', True, True),
    'device': ('string', 'cuda', 'cuda'),
    'nthread_per_process': ('int32', 1, 1),
    'tensor_parallel': ('uint32', 1, 1),
    'sequence_parallel': ('bool', False, False),
    'pipeline_parallel': ('uint32', 1, 1),
    'virtual_pipeline_parallel': ('uint32', 1, 1),
    'dtype': ('string', 'float32', 'float32'),
    'save_interval': ('uint32', 0, 0),
    'load': ('string', '', ''),
    'save': ('string', '', ''),
    'max_checkpoint_keep': ('uint32', 3, 3),
    'save_optimizer_state': ('bool', True, True),
    'precision_check': ('string', '', ''),
    'lora_rank': ('int32', 0, 0),
    'lora_alpha': ('double', 16.0, 16.0),
    'lora_target_modules': ('string', 'c_attn,c_proj', 'c_attn,c_proj,c_fc,c_fc2'),
    'lora_save_path': ('string', '', ''),
    'lora_load_path': ('string', '', ''),
}
# The checkpoint generation before HEAD: f9cb65b5408a90db2d88658609cabf58a2ca7539 (an ancestor
# of HEAD) and, for --use_llmc_checkpoint_io, b8e9dd2f7a9cf692deb1b700b1796a99144bc3c0.
PR_FLAGS = {
    'checkpoint_dir': ('string', './checkpoints', './checkpoints'),
    'save_steps': ('uint32', 0, 0),
    'resume_from': ('string', '', ''),
    'checkpoint_format': ('string', 'pth', 'pth'),
    'use_llmc_checkpoint_io': ('bool', False, False),
}
# PR 151, LR schedulers: a7949ac0f46fb3de64520a18bc13ebc70b6bc158 example/gpt2/main.cc (llama3 the same).
LR_SCHEDULER_FLAGS = {
    'min_lr': ('double', 0.0, 0.0),
    'lr_decay_style': ('string', 'constant', 'constant'),
    'lr_warmup_iters': ('int64', 0, 0),
    'lr_warmup_init': ('double', 0.0, 0.0),
    'lr_decay_iters': ('int64', 0, 0),
}
# PR 154, activation recompute: feat/activation_checkpointing e594d9c example/gpt2/main.cc:82-86 (llama3 the
# same); and --no_save_optim of the checkpoint branch's older builds (c82cbe8 example/gpt2/main.cc).
RECOMPUTE_AND_OLDER_FLAGS = {
    'activation_recompute': ('bool', False, False),
    'recompute_granularity': ('string', 'full', 'full'),
    'recompute_method': ('string', 'none', 'none'),
    'recompute_num_layers': ('uint32', 0, 0),
    'no_save_optim': ('bool', False, False),
}
# PR 181, context parallelism: feat/context_parallel d03ba16 example/gpt2/main.cc:82-83 (llama3 :81-82).
CONTEXT_PARALLEL_FLAGS = {
    'context_parallel': ('uint32', 1, 1),
    'cp_comm_type': ('string', 'p2p', 'p2p'),
}
KIND = {
    'string': 'string',
    'uint32': 'int',
    'int32': 'int',
    'int64': 'int',
    'double': 'float',
    'bool': 'bool',
}


def _table():
    from jaxtrain.config import infinitrain_flags

    return infinitrain_flags


def test_the_table_is_upstreams_list_of_51_flags():
    table = _table()
    upstream = {
        **HEAD_FLAGS,
        **PR_FLAGS,
        **LR_SCHEDULER_FLAGS,
        **RECOMPUTE_AND_OLDER_FLAGS,
        **CONTEXT_PARALLEL_FLAGS,
    }
    assert len(upstream) == 51
    assert [f.name for f in table.UPSTREAM] == list(upstream)
    for flag in table.UPSTREAM:
        kind, gpt2_default, llama3_default = upstream[flag.name]
        ours = (flag.kind, flag.gpt2_default, flag.llama3_default)
        assert ours == (KIND[kind], gpt2_default, llama3_default), flag.name
    assert table.HEAD_COMMIT.startswith('b24d92f')


def test_every_upstream_flag_is_a_flag_of_the_trainer():
    from absl import flags

    import jaxtrain.main  # noqa: F401  defines the flags

    from jaxtrain.config.keys import KEYS

    keys = {key for key, _, _ in KEYS}
    table = _table()
    for name in {**HEAD_FLAGS, **PR_FLAGS, **LR_SCHEDULER_FLAGS, **RECOMPUTE_AND_OLDER_FLAGS}:
        assert name in flags.FLAGS, name
        handling = table.BY_NAME[name].handling
        # 'key': a config key of that name; 'renamed': sets another key; 'later': refused when set.
        if handling == 'key':
            assert name in keys, name
        if handling == 'renamed':
            assert table.BY_NAME[name].target in keys


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('infinitrain_flags')
    return {
        'model': tiny_llmc_model(root / 'gpt2.bin'),
        'shard': random_shard(root / 'train.bin', num_tokens=4_000),
        'root': root,
    }


def _gpt2(files, *args):
    return ['--llmc_filepath', files['model'], '--input_bin', files['shard'], '--device', 'cpu', *args]


# One value per flag that another issue builds, other than upstream's default.
LATER_VALUES = {
    'tokenizer_bin': 'gpt2_tokenizer.bin',
    'freq_generate_txt': 5,
    'text_length': 32,
    'sample_every': 2,
    'sequence_parallel': 'true',
    'pipeline_parallel': 8,
    'virtual_pipeline_parallel': 2,
    'precision_check': 'level=1',
    'lora_rank': 8,
    'lora_alpha': 8.0,
    'lora_target_modules': 'c_attn,attn.c_proj',
    'lora_save_path': 'lora.bin',
    'lora_load_path': 'lora.bin',
}


def _later_names():
    table = _table()
    later = [name for name in LATER_VALUES if table.BY_NAME[name].handling == 'later']
    return [name for name in later if name in table.alias_names()]  # not yet a config key


def test_every_flag_another_issue_built_is_now_its_own_config_key():
    """The flags the table once refused as "not supported yet" (sampling, sequence and
    pipeline parallelism, the precision checker, LoRA) are each honoured by a config key of
    the same name now, so none is left to refuse."""
    assert _later_names() == []
    keys = set(_table()._config_keys())
    assert set(LATER_VALUES) <= keys, sorted(set(LATER_VALUES) - keys)


@pytest.mark.slow  # trains
def test_upstream_defaults_of_every_flag_run(files):
    """InfiniTrain's defaults spelled out, every flag at once (the bool ones bare or with a
    value, as gflags takes them): the run trains."""
    table = _table()
    later = []
    for name in _later_names():
        value = table.BY_NAME[name].gpt2_default
        later += [f'--{name}', str(value).lower() if isinstance(value, bool) else value]
    result = run_cli(
        *_gpt2(files, *later),
        '--nthread_per_process', 1, '--tensor_parallel', 1, '--zero_stage', 0,
        '--use_llmc_checkpoint_io', 'false', '--checkpoint_format', 'orbax', '--dtype', 'float32',
        '--num_iteration', 1, '--overfit_single_batch', 'false',
        num_devices=None,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert 'DP=1, TP=1, SP=1, PP=1)' in result.out


def test_save_and_save_interval_must_come_together(files, tmp_path):
    alone = run_cli(*_gpt2(files, '--save', tmp_path / 'ck'))
    assert alone.code == 1 and 'expected --save_interval N > 0' in alone.err and 'set together' in alone.err
    interval = run_cli(*_gpt2(files, '--save_interval', 2))
    assert interval.code == 1 and 'expected --save DIR' in interval.err
    assert not (tmp_path / 'ck').exists()


@pytest.mark.slow  # trains
def test_checkpoint_format_spellings_write_infinitrain_files(files, tmp_path):
    """Upstream's spellings pick our InfiniTrain writers: pth (f9cb65b's CKPT state dicts) writes
    HEAD's model.ckpt, and the PR branch's --use_llmc_checkpoint_io the llm.c model.bin."""
    assert _table().canonical_checkpoint_format('pth') == 'infinitrain'
    assert _table().canonical_checkpoint_format('bin') == 'infinitrain-bin'
    cases = {
        'pth': (('--checkpoint_format', 'pth'), 'model.ckpt'),
        'infinitrain': (('--checkpoint_format', 'infinitrain'), 'model.ckpt'),
        'llmc_io': (('--use_llmc_checkpoint_io',), 'model.bin'),
    }
    for name, (args, model_file) in cases.items():
        root = tmp_path / name
        result = run_cli(
            *_gpt2(files, *args, '--checkpoint_dir', root, '--save_steps', 1, '--num_iteration', 1)
        )
        assert result.code == 0, result.err
        written = sorted(p.name for p in (root / 'checkpoint_step_000001').iterdir())
        assert model_file in written and 'trainer_state.json' in written, (name, written)


def test_device_cuda_without_a_gpu_is_an_error(files):
    result = run_cli(*_gpt2(files, '--device', 'cuda'))
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    assert 'expected a CUDA GPU for --device cuda, found JAX on cpu' in result.err


@pytest.mark.slow  # trains
def test_nthread_per_process_and_tensor_parallel_shape_the_mesh(files):
    """InfiniTrain: DP = nthread_per_process / tensor_parallel; the step line says so."""
    result = run_cli(
        *_gpt2(files, '--nthread_per_process', 4, '--tensor_parallel', 2, '--batch_size', 2),
        '--num_iteration',
        1,
        num_devices=None,
    )
    assert result.code == 0, result.err
    assert 'mesh data 2 × fsdp 1 × tensor 2' in result.out
    assert 'DP=2, TP=2, SP=1, PP=1)' in result.out


def test_upstream_model_names_are_the_openai_and_llmc_sizes():
    from jaxtrain.models import gpt2, llama3

    # kModelToConfigs in example/gpt2/main.cc (b24d92f): (n_layer, n_head, n_embd).
    expected = {'d12': (12, 12, 768), 'd24': (24, 16, 1024), 'd36': (36, 20, 1280), 'd48': (48, 25, 1600)}
    expected.update(gpt2=expected['d12'], **{'gpt2-medium': expected['d24'], 'gpt2-large': expected['d36']})
    expected['gpt2-xl'] = expected['d48']
    for name, shape in expected.items():
        config = gpt2.VARIANTS[name]
        assert (config.num_layers, config.num_heads, config.channels, config.vocab_size) == (*shape, 50257)
    # example/llama3/config.h LLaMA3Config(): 16 layers, 32 heads, 8 KV heads, 2048, FFN 1.5/256.
    config = llama3.VARIANTS['llama3']
    shape = (config.num_layers, config.num_heads, config.num_kv_heads, config.channels, config.vocab_size)
    assert shape == (16, 32, 8, 2048, 128256)
    assert (config.ffn_dim_multiplier, config.multiple_of, config.rope_theta) == (1.5, 256, 500000.0)


@pytest.mark.slow  # trains
def test_no_save_optim_of_older_builds_keeps_the_optimizer_file_out(files, tmp_path):
    """c82cbe8's --no_save_optim true is --save_optimizer_state false: Checkpoint::Save writes no
    optimizer file (`if (!no_save_optim)`); false (its default) writes one."""
    for value, expected in (('true', False), ('false', True)):
        root = tmp_path / value
        result = run_cli(
            *_gpt2(files, '--no_save_optim', value, '--checkpoint_format', 'pth'),
            '--save', root, '--save_interval', 1, '--num_iteration', 1,
        )  # fmt: skip
        assert result.code == 0, result.err
        assert (root / 'checkpoint_step_000001' / 'optimizer.ckpt').is_file() == expected
    both = run_cli(*_gpt2(files, '--no_save_optim', 'true', '--save_optimizer_state', 'true'))
    assert both.code == 1 and 'expected one of them' in both.err and len(both.err.strip().splitlines()) == 1
