"""Our trainer continues llm.c's own run: from train_gpt2cu's step-10 checkpoint (tests/fixtures/llmc_run),
steps 11-20 against llm.c's log of the same steps.

Tolerance: llm.c trains in bf16 with fp32 master weights and rounds the bf16 copy stochastically; ours
keeps fp32 parameters (bf16 compute here). Measured over steps 11-20: at most 0.0015 (bf16) and 0.0016
(fp32) from llm.c's losses; the same run reading batches in order (--shuffle none) from step 0 differs
by up to 0.17. LOSS_TOLERANCE is 0.005: three times the measured gap, thirty times below a wrong batch.
"""

import re
import shutil
from pathlib import Path

import pytest
from trainer_runs import load_config, train

from jaxtrain.checkpoint.layout import CheckpointError

RUN = Path(__file__).resolve().parents[1] / 'fixtures' / 'llmc_run'
LOSS_TOLERANCE = 0.005


def llmc_losses() -> dict[int, float]:
    text = (RUN / 'a.log').read_text()
    return {int(m[1]): float(m[2]) for m in re.finditer(r'step\s+(\d+)/20 \| loss ([\d.]+)', text)}


def llmc_run_config(tmp_path, **overrides):
    """train_gpt2cu -b 4 -t 64 -l 1e-3 -u 5 -x 20 (commands.txt) in our keys; llm.c's defaults for the
    rest: cosine to final fraction 1.0 (constant after warmup), AdamW 0.9/0.95/1e-8, no weight decay,
    gradient clip 1.0."""
    settings = {
        'input_bin': str(RUN / 'data' / 'tiny_train_*.bin'),
        'shuffle': 'llmc',
        'dtype': 'bfloat16',
        'sample_every': 0,
        'metrics_dir': str(tmp_path / 'metrics'),
        'num_iteration': 20,
    }
    return load_config(
        'gpt2',
        llmc_filepath=str(RUN / 'model_init_bf16.bin'),
        batch_size=4,
        sequence_length=64,
        total_batch_size=256,
        learning_rate=1e-3,
        lr_schedule='cosine',
        warmup_steps=5,
        min_lr_ratio=1.0,
        beta1=0.9,
        beta2=0.95,
        eps=1e-8,
        weight_decay=0.0,
        grad_clip=1.0,
        **{**settings, **overrides},
    )


@pytest.mark.slow
def test_steps_11_to_20_from_llmc_checkpoint_match_llmc_log(tmp_path):
    config = llmc_run_config(tmp_path, resume_from=str(RUN / 'a' / 'model_00000010.bin'))
    code, losses, out = train(config)
    assert code == 0, out[-2000:]
    assert 'restored step 10 from llm.c run' in out and 'fp32 master weights' in out
    # train_gpt2cu records no data identity beside its state: the resume says what was checked.
    assert "records no data identity (train_gpt2cu writes none): the shards were checked only as far" in out
    # llm.c's state file keeps no learning rate: the line gives the schedule's, 1e-3 after warmup
    assert 'last_lr=0.001, ' in out
    reference = llmc_losses()
    assert sorted(losses) == list(range(11, 21))
    gaps = {step: abs(losses[step] - reference[step]) for step in losses}
    assert max(gaps.values()) < LOSS_TOLERANCE, gaps


@pytest.mark.slow
def test_llmc_order_needs_shuffle_llmc_and_says_so_in_one_line(tmp_path):
    config = llmc_run_config(tmp_path, resume_from=str(RUN / 'a'), shuffle='none')
    with pytest.raises(CheckpointError) as e:
        train(config)
    message = str(e.value)
    assert '\n' not in message and 'header[5] should_shuffle' in message and 'pass --shuffle llmc' in message


@pytest.mark.slow
def test_a_nan_in_llmcs_master_weights_is_refused_on_load_naming_the_state_file(tmp_path):
    """Not trained from, to be reported as a divergence at step 11 naming the damaged step as the
    last good one: refused before training."""
    import numpy as np

    run = tmp_path / 'run'
    shutil.copytree(RUN / 'a', run)
    state = run / 'state_00000010_00000.bin'
    # docs/formats.md: a 1024-byte header, then m, v and the master weights, fp32[N] each.
    n = (state.stat().st_size - 1024) // 12  # N and a few hundred (the loader state's KiB after them)
    with open(state, 'r+b') as f:  # so value 2n + 100 is well inside the master weights
        f.seek(1024 + 4 * (2 * n + 100))
        f.write(np.float32(np.nan).tobytes())
    config = llmc_run_config(tmp_path, resume_from=str(run / 'model_00000010.bin'))
    with pytest.raises(CheckpointError) as e:
        train(config)
    message = str(e.value)
    assert '\n' not in message and message.startswith(f'{state}: master weights: expected finite values')
    assert 'found 1 non-finite' in message and 'resume an earlier step' in message, message


@pytest.mark.slow
def test_our_checkpoint_resumes_llmc_order_bitwise_and_refuses_the_other_order(tmp_path):
    """12 steps cross the 10-step epoch (a new llm.c permutation); a resume from step 6 reads the
    same batches, because the order is a function of the saved position and the recorded shuffle."""
    common = {'num_iteration': 12, 'save_steps': 6, 'save_optimizer_state': True, 'dtype': 'float32'}
    full = llmc_run_config(tmp_path / 'full', checkpoint_dir=str(tmp_path / 'full'), **common)
    code, full_losses, out = train(full)
    assert code == 0, out[-2000:]
    step6 = str(tmp_path / 'full' / 'checkpoint_step_000006')
    again = llmc_run_config(
        tmp_path / 'again', checkpoint_dir=str(tmp_path / 'again'), resume_from=step6, **common
    )
    code, losses, out = train(again)
    assert code == 0, out[-2000:]
    assert [losses[s] for s in range(7, 13)] == [full_losses[s] for s in range(7, 13)]
    other = llmc_run_config(
        tmp_path / 'other',
        checkpoint_dir=str(tmp_path / 'other'),
        resume_from=step6,
        shuffle='none',
        **common,
    )
    with pytest.raises(
        CheckpointError, match=r"shuffle: checkpoint 'llmc', now 'none' \(pass --shuffle llmc\)"
    ):
        train(other)


@pytest.fixture(scope='module')
def llmc_format_run(tmp_path_factory):
    """A 12-step --checkpoint_format llmc run into work/A (steps 5, 10, 12), on a copy of the
    fixture's shards in work/data: (work, {step: loss}, stdout)."""
    work = tmp_path_factory.mktemp('llmc_format')
    shutil.copytree(RUN / 'data', work / 'data')
    first = llmc_format_config(work, work / 'm1', checkpoint_dir=str(work / 'A'))
    code, full, out = train(first)
    assert code == 0, out[-2000:]
    return work, full, out


LLMC_FORMAT_RUN = {'num_iteration': 12, 'save_steps': 5, 'checkpoint_format': 'llmc', 'dtype': 'float32'}


def llmc_format_config(work, out_dir, **overrides):
    data = str(work / 'data' / 'tiny_train_*.bin')
    return llmc_run_config(out_dir, input_bin=data, **{**LLMC_FORMAT_RUN, **overrides})


@pytest.mark.slow
def test_checkpoint_format_llmc_saves_a_run_folder_that_resumes_exactly(llmc_format_run, tmp_path):
    """--checkpoint_format llmc: the folder holds what llm.c's own run holds at the same step (its
    loader state byte for byte), and our resume from one of its steps repeats the losses bit for bit."""
    from jaxtrain.checkpoint.resume import resolve_resume
    from llmc_io import llmc_run

    work, full, out = llmc_format_run
    assert llmc_run.committed_steps(work / 'A') == [5, 10, 12]
    assert f"save: step 5 -> {work / 'A' / 'model_00000005.bin'}" in out
    assert f'[CKPT] Save done: dir="{work / "A" / "model_00000005.bin"}"' in out  # the file that exists
    loader = 8 + 2 * 4 + 8 + 5 * 4 + 2520
    ours = (work / 'A' / 'state_00000010_00000.bin').read_bytes()
    assert ours[-loader:] == (RUN / 'a' / 'state_00000010_00000.bin').read_bytes()[-loader:]
    assert resolve_resume('latest', str(work / 'A'), 'llmc')[0] == work / 'A' / 'model_00000012.bin'
    again = llmc_format_config(
        work,
        tmp_path / 'm2',
        checkpoint_dir=str(tmp_path / 'B'),
        resume_from=str(work / 'A' / 'model_00000005.bin'),
    )
    code, resumed, out = train(again)
    assert code == 0, out[-2000:]
    assert [resumed[s] for s in range(6, 13)] == [full[s] for s in range(6, 13)]
    for name in ('model_00000012.bin', 'state_00000012_00000.bin'):
        assert (tmp_path / 'B' / name).read_bytes() == (work / 'A' / name).read_bytes()


@pytest.mark.slow
def test_shards_swapped_under_the_same_names_are_refused_on_resuming_our_llmc_step(llmc_format_run, tmp_path):
    """llm.c's loader state holds the shard count and samples per shard, which two shards of one
    size swapped keep: the data identity recorded beside it tells them apart."""
    import json

    work, _, _ = llmc_format_run
    one, two = work / 'data' / 'tiny_train_000001.bin', work / 'data' / 'tiny_train_000002.bin'
    first, second = one.read_bytes(), two.read_bytes()
    assert len(first) == len(second) and first != second
    record = work / 'A' / 'jaxtrain_data_00000005.json'
    shards = json.loads(record.read_text())['data']['shards']
    assert [shard['path'] for shard in shards] == [str(one.resolve()), str(two.resolve())]
    resuming = llmc_format_config(
        work, tmp_path, resume_from=str(work / 'A' / 'model_00000005.bin'), checkpoint_dir=str(tmp_path / 'B')
    )
    one.write_bytes(second), two.write_bytes(first)
    try:
        with pytest.raises(CheckpointError) as refused:
            train(resuming)
    finally:
        one.write_bytes(first), two.write_bytes(second)
    message = str(refused.value)
    assert '\n' not in message and f'shard 0 {one.resolve()}: other content at the same size' in message
    assert f'listed under "data" in {record}' in message and '--accept_changed_data true' in message


@pytest.mark.slow
def test_rotation_keeps_the_llmc_step_the_run_resumed_from(tmp_path):
    from llmc_io import llmc_run

    run = tmp_path / 'run'
    shutil.copytree(RUN / 'a', run, ignore=shutil.ignore_patterns('*00000020*'))
    # What a save killed mid-file (kill -9) leaves: atomic_output's temporaries; and a file of the user's.
    killed = ['model_00000011.bin.k2_j9x.tmp', 'state_00000011_00000.bin.a1b2c3.tmp', 'DONE_00000011.zz9.tmp']
    for name in [*killed, 'notes.tmp']:
        (run / name).write_bytes(b'half')
    config = llmc_run_config(
        tmp_path,
        checkpoint_dir=str(run),
        resume_from=str(run / 'model_00000010.bin'),
        checkpoint_format='llmc',
        num_iteration=12,  # the step program of the 12-step runs above (the schedule spans num_iteration)
        save_steps=1,
        max_checkpoint_keep=1,
        dtype='float32',
    )
    code, _, out = train(config)
    assert code == 0, out[-2000:]
    assert llmc_run.committed_steps(run) == [10, 12]
    assert not (run / 'model_00000011.bin').exists() and (run / 'state_00000010_00000.bin').is_file()
    assert [p.name for p in run.glob('*.tmp')] == ['notes.tmp']


@pytest.mark.slow
def test_a_garbled_bf16_model_file_is_refused_though_the_resume_reads_master_weights(tmp_path):
    """The resume takes llm.c's fp32 master weights, not the bf16 model file; `ckpt verify` checks
    one against the other, and so does the resume (one verification per format)."""
    run = tmp_path / 'run'
    shutil.copytree(RUN / 'a', run, ignore=shutil.ignore_patterns('*00000020*'))
    model = run / 'model_00000010.bin'
    garbled = bytearray(model.read_bytes())
    garbled[2024:2034] = bytes(range(0x40, 0x4A))  # bf16 weights far from their master copies
    model.write_bytes(bytes(garbled))
    with pytest.raises(CheckpointError) as e:
        train(llmc_run_config(tmp_path, resume_from=str(run)))
    message = str(e.value)
    assert message.startswith(f'resume_from: {model}: ') and 'more than one bf16 step from the' in message
    assert '\n' not in message and f'python -m jaxtrain.ckpt verify {model}' in message
