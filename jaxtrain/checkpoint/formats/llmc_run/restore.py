"""llm.c run folders (llmc_io/llmc_run.py) as a checkpoint format: `--resume_from RUN_DIR` (its newest
committed step) or `--resume_from RUN_DIR/model_%08d.bin` (that step); `--checkpoint_format llmc`
saves a run as one (llmc_run/writer.py).

What maps to what (karpathy/llm.c f1e2ace6 train_gpt2.cu load_state):
  params                  <- the fp32 master weights where the state has them (-w 1, the default),
                             else the model file's bf16 values
  optax ScaleByAdamState  <- m, v; count = step (llm.c's AdamW takes t = step + 1 for the next update)
  ScaleByScheduleState    <- step: the schedule continues where llm.c stopped
  data_position           <- step; the loader state llm.c saved (shard and sample, permutations,
                             mt19937) must equal our replay of its order at that step (--shuffle llmc)
llm.c's rng_state is its stochastic-rounding seed, which our fp32 parameters do not use: it is kept
in the record (an export writes it back) and the run keeps its own rng.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxtrain.checkpoint.format import Resumed, Verification, Weights, refuse_problems
from jaxtrain.checkpoint.formats.llmc_run import inspection
from jaxtrain.checkpoint.formats.llmc_run.inspection import KIND, locate, read_step
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.checkpoint.resume_checks import check_data
from jaxtrain.optim.optimizer import adam_states, learning_rate_at, put_tree, with_adam_moments
from jaxtrain.parallel import sharding
from llmc_io import llmc_run
from llmc_io.errors import LLMCFormatError
from llmc_io.llmc_state import MATRIX_A, check_state_values, flat_to_tree, state_value_problems, tree_to_flat
from llmc_io.tensors import tree_leaves


def _replayed(stream, step: int) -> str:
    return (
        f'llm.c\'s after {step * stream.accumulation} batches of {stream.pattern} '
        f'at {stream.sample_tokens} tokens per batch'
    )


def check_loader(state_path, state, stream, step: int) -> None:
    """The saved loader position and shuffle state against our replay of llm.c's order at `step`."""
    where = str(state_path)
    if state.shuffle is None:
        raise LLMCFormatError(
            where,
            'header[5] should_shuffle',
            "1 (llm.c's permuted loader)",
            0,
            'the run used an unshuffled loader (overfit_single_batch); resuming it is not supported',
        )
    if not hasattr(stream, 'loader_state'):
        raise LLMCFormatError(
            where,
            'header[5] should_shuffle',
            'the order this run reads (--shuffle none)',
            "1 (llm.c's permuted order)",
            'pass --shuffle llmc to continue in the order llm.c was reading',
        )
    shard_idx, sample_idx, ours = stream.loader_state(step)
    saved = state.shuffle
    checks = (
        ('shuffle state: num_shards', len(ours.shard_indices), len(saved.shard_indices)),
        ('shuffle state: shard_num_samples', len(ours.intra_shard_indices), len(saved.intra_shard_indices)),
        ('header[30] current_shard_idx', shard_idx, state.current_shard_idx),
        ('header[32] current_sample_idx', sample_idx, state.current_sample_idx),
    )
    for field, expected, found in checks:
        if expected != found:
            raise LLMCFormatError(
                where,
                field,
                f'{expected} ({_replayed(stream, step)})',
                found,
                'the run used other shards, batch size or sequence length; pass the ones it used',
            )
    for field, same in (
        ('shuffle state: shard_indices', np.array_equal(ours.shard_indices, saved.shard_indices)),
        (
            'shuffle state: intra_shard_indices',
            np.array_equal(ours.intra_shard_indices, saved.intra_shard_indices),
        ),
        ('shuffle state: mt19937 state', ours.rng.same_as(saved.rng)),
    ):
        if not same:
            raise LLMCFormatError(
                where,
                field,
                f'the permutation llm.c draws at step {step} for these shards',
                'another one',
                'the run used other shards (or another order of them); pass the ones it used',
            )


def optimizer_state(opt_like, m_tree, v_tree, step: int):
    """The run's optax state with llm.c's AdamW moments and the schedule at `step`."""
    found = adam_states(opt_like)
    if len(found) != 1:
        raise CheckpointError(
            f'optimizer: expected adamw to continue an llm.c run (its state is AdamW m and v), '
            f'found an optimizer with {len(found)} Adam states; pass --optimizer adamw'
        )
    return with_adam_moments(opt_like, m_tree, v_tree, adam_count=step, schedule_count=step)


def _check_data(ckpt, config) -> list[str]:
    """The training data against the identity a step of ours recorded beside llm.c's state
    (resume_checks.check_data: other data is refused unless accept_changed_data). A step
    train_gpt2cu wrote records none: its loader state (check_loader) is all there is to check."""
    if ckpt.data is None:
        return [
            f'resume: step {ckpt.step} of {ckpt.run_dir} records no data identity (train_gpt2cu writes '
            "none): the shards were checked only as far as llm.c's loader state goes (their count and "
            'samples per shard), not their content'
        ]
    recorded_in = llmc_run.data_record_path(ckpt.run_dir, ckpt.step)
    return check_data({'data': ckpt.data}, config, ckpt.model_path, recorded_in)


class LLMCRunFormat:
    """Reads llm.c run folders (and the model file of one of their steps) for a resume."""

    name = KIND
    title = 'llm.c'
    no_val_loss = "llm.c's run folder has no place for it"

    def owns(self, path) -> bool:
        path = Path(path)
        named = llmc_run.split_model_path(path)
        if named is not None:
            return llmc_run.is_run_dir(named[0])
        return llmc_run.is_run_dir(path)

    def committed_steps(self, root) -> list[int]:
        return llmc_run.committed_steps(root)

    def open(self, config, parts, protected_steps):
        from jaxtrain.checkpoint.formats.llmc_run.writer import LLMCRunCheckpointer

        return LLMCRunCheckpointer(config, parts, protected_steps)

    def step_path(self, root, step: int) -> Path:
        """What --resume_from latest resumes: the step's model file in the run folder."""
        return llmc_run.model_path(Path(root).absolute(), step)

    def read_record(self, path) -> dict:
        _run_dir, step = locate(path)
        return {'step': step, 'kind': KIND}

    def verify(self, path) -> Verification:
        """RUN_DIR (its newest committed step) or RUN_DIR/model_%08d.bin: DONE marker, headers and
        sizes, finite m, v and master weights, the bf16 model within one bf16 step of the master
        weights (a resume reads only the master copy), the loader state well formed, an export's
        recorded sha256s. A step that is
        not committed or not whole raises CheckpointError (read_step's line), as `ckpt show` does."""
        return _verified(path)

    def read_weights(self, path) -> Weights:
        """The step's model file (a run folder's newest committed step, or the one named)."""
        import dataclasses

        import llmc_io

        try:
            run_dir, step = locate(path)
            header, params = llmc_io.load_model(llmc_run.model_path(run_dir, step))
        except LLMCFormatError as e:
            raise CheckpointError(str(e)) from None
        family = 'gpt2' if isinstance(header, llmc_io.GPT2Header) else 'llama3'
        what = f'llm.c run folder {run_dir}, step {step}'
        return Weights(family, params, what, dataclasses.asdict(header), {'step': step, 'kind': KIND})

    def find_step(self, path, finished: bool = True) -> Path:
        return Path(path)

    def ls_rows(self, root) -> list[dict]:
        return []  # its steps are the files of a run folder, which ls lists alone

    def ls(self, root, rows: list[dict], validation) -> dict:
        return inspection.ls(root)

    def ls_text(self, listed: dict) -> str:
        return inspection.ls_text(listed)

    def show(self, step_dir, with_tensors: bool) -> dict:
        return inspection.show(step_dir, with_tensors)

    def show_text(self, shown: dict, show_all: bool) -> str:
        return inspection.show_text(shown)

    def diff_view(self, step_dir, common: bool) -> tuple[dict, dict]:
        raise inspection.refused(step_dir, 'ckpt diff', '')

    def refuse_as_source(self, path, command: str, target: str = '') -> None:
        """Its model file is an llm.c file already: llmc_io converts it, --init_from reads it."""
        raise inspection.refused(path, command, target)

    def resume_step(self, path: Path) -> Path:
        return Path(path)  # a model file of a committed step: owns() has checked it

    def restore_into(self, config, parts, path: Path) -> Resumed:
        from jaxtrain.data.stream import data_paths, train_stream  # the data the run will read

        state = parts.state
        try:
            run_dir, step = locate(path)
            ckpt = llmc_run.read_step(
                run_dir, step, need_master=bool(config.get('llmc_require_master_weights'))
            )
            want = {p: tuple(leaf.shape) for p, leaf in tree_leaves(state.params).items()}
            have = ckpt.header.param_shapes()
            if want != have:
                different = sorted(p for p in set(want) | set(have) if want.get(p) != have.get(p))
                p = different[0]
                raise LLMCFormatError(
                    ckpt.model_path,
                    f'params[{p}]',
                    f'shape {want.get(p)} (this run\'s model)',
                    f'shape {have.get(p)}',
                    f'pass --llmc_filepath {ckpt.model_path} so the run takes the checkpoint\'s shape',
                )
            stream = train_stream(
                config, parts.geometry, parts.setup.model_config.vocab_size, data_paths(config)[0]
            )
            check_loader(ckpt.state_path, ckpt.state, stream, step)
            check_state_values(ckpt.state_path, ckpt.state)
        except LLMCFormatError as e:
            raise CheckpointError(f'{e}') from None
        data_lines = _check_data(ckpt, config)
        # Then every check `ckpt verify` makes: the bf16 model file too, which a resume from master
        # weights does not read, and finite moments. A resume refuses what verify rejects.
        refuse_problems(_verified(ckpt.model_path, ckpt), ckpt.model_path, 'resume_from')
        s = ckpt.state
        source = 'fp32 master weights' if s.master is not None else f'the bf16 model (v{ckpt.model_version})'
        if s.master is not None:
            weights = flat_to_tree(s.master, ckpt.header)
        else:
            import llmc_io

            weights = llmc_io.load_gpt2(ckpt.model_path)[1]
        params = put_tree(state.params, weights)
        opt_state = optimizer_state(
            state.opt_state, flat_to_tree(s.m, ckpt.header), flat_to_tree(s.v, ckpt.header), step
        )
        replicated = parts.replicated
        state = state.replace(
            step=sharding.put_global(np.int32(step), replicated),
            data_position=sharding.put_global(np.int32(step), replicated),
            params=params,
            opt_state=opt_state,
        )
        record = {
            'step': step,
            'data_position': step,
            'rng': None,
            'kind': KIND,
            # llm.c's state file keeps no learning rate: the one this run's schedule gives the next
            # step, as an Orbax record holds (the `[CKPT] Load done` line prints it).
            'learning_rate': learning_rate_at(parts.schedule, step),
            'llmc_rng_state': s.rng_state,
            'llmc_rng_state_last_update': s.rng_state_last_update,
        }
        messages = [
            (
                f'resume: restored step {step} from llm.c run {run_dir} (params from {source}, AdamW m '
                'and v, '
                f'loader at shard position {s.current_shard_idx} sample {s.current_sample_idx}, the same as '
                "our replay of llm.c's order); llm.c's stochastic-rounding rng is not used, the run keeps "
                f'seed {config.seed}\'s'
            )
        ]
        return Resumed(state, ckpt.model_path, record, messages + data_lines)


def _verified(path, ckpt=None) -> Verification:
    try:
        return verify(path, ckpt)
    except (LLMCFormatError, OSError) as e:  # the model file's values unreadable
        return Verification([str(e)], [])


def verify(path, ckpt=None) -> Verification:
    """Everything read_step checks (DONE marker, header, sizes, one rank), then the values: finite m,
    v and master weights, v >= 0, the bf16 model within one bf16 step of the master weights (llm.c
    rounds them stochastically), the loader's permutations and mt19937 state well formed, and the
    sha256 of the files an export's record vouches for. ckpt: the step as a resume has just read it
    (read_step's checks made), or None to read it here."""
    import llmc_io

    if ckpt is None:
        ckpt = read_step(path)  # a step that is not committed or not whole is an error, as for show
    s, problems = ckpt.state, []
    checked = [
        f'step {ckpt.step} committed (DONE marker)',
        f'model v{ckpt.model_version} header and size',
        'state header and size',
    ]
    for field, expected, found in state_value_problems(s):
        problems.append(f'{ckpt.state_path}: {field}: expected {expected}, found {found}')
    # llm.c's files carry no checksums; an export's record does, and only it sees a changed low bit.
    exported = llmc_run.export_record_path(ckpt.run_dir, ckpt.step)
    for file, expected, found in llmc_run.changed_since_export(ckpt.run_dir, ckpt.step):
        problems.append(f'{file}: sha256: expected {expected} ({exported.name}), found {found}')
    if exported.is_file():
        checked.append(f'sha256 of the files {exported.name} records')
    checked.append('m, v' + (', master weights' if s.master is not None else '') + ' finite')
    if s.master is not None:
        model = tree_to_flat(ckpt.model_path, llmc_io.load_gpt2(ckpt.model_path)[1], ckpt.header)
        master = np.asarray(s.master, np.float32)
        ulp = np.abs(master) * 2.0**-7 + np.finfo(np.float32).tiny
        far = int(np.count_nonzero(np.abs(model - master) > ulp))
        if far:
            problems.append(
                f'{ckpt.model_path}: {far} value(s) more than one bf16 step from the master weights '
                '(expected the model to be the master weights rounded)'
            )
        checked.append('model = master weights rounded to bf16')
    if s.shuffle is not None:
        sh = s.shuffle
        for name, perm in (
            ('shard_indices', sh.shard_indices),
            ('intra_shard_indices', sh.intra_shard_indices),
        ):
            if sorted(perm.tolist()) != list(range(len(perm))):
                problems.append(f'{ckpt.state_path}: {name}: expected a permutation of 0..{len(perm) - 1}')
        if not 1 <= sh.rng.left <= 624 or tuple(sh.rng.matrix_a) != MATRIX_A:
            problems.append(
                f'{ckpt.state_path}: mt19937 state: expected left in 1..624 and MATRIX_A '
                f'{MATRIX_A}, found left {sh.rng.left}, MATRIX_A {sh.rng.matrix_a}'
            )
        if s.current_shard_idx >= len(sh.shard_indices) or s.current_sample_idx > len(sh.intra_shard_indices):
            problems.append(
                f'{ckpt.state_path}: loader position: expected within {len(sh.shard_indices)} '
                f'shards / {len(sh.intra_shard_indices)} samples, found shard '
                f'{s.current_shard_idx} sample {s.current_sample_idx}'
            )
        checked.append('loader permutations and mt19937 state well formed')
    return Verification(problems, checked)
