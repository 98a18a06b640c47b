"""Our state as a step of an llm.c run folder, which `train_gpt2cu -y 1` resumes: the run's saves
(LLMCRunCheckpointer) and `ckpt export --format llmc-run` (export), both through llmc_run.write_step.

`--checkpoint_format llmc`: the run saves into --checkpoint_dir as an llm.c run folder, each step
model_%08d.bin (v5 bf16), state_%08d_00000.bin and DONE_%08d, which `train_gpt2cu -y 1` resumes and
`--resume_from DIR` / `--resume_from latest` read back (llmc_run.py).

The state holds AdamW m and v, our fp32 parameters as master weights and llm.c's loader state at the
saved data position (replayed, so the run must read llm.c's order: --shuffle llmc). Saves are
synchronous; rotation keeps the newest max_checkpoint_keep steps, every multiple of keep_every_steps
and the step the run resumed from, deleting DONE first (as a step without it is not committed).
A save clears its step's DONE before writing (llmc_run.write_step), and a run starting removes the
temporaries a save killed mid-file left behind.

`ckpt export --format llmc-run`: one of our Orbax steps into an llm.c run folder.

The export writes the step as model_%08d.bin (v5 bf16, as train_gpt2cu's bf16 build reads;
--version 3: fp32, for a PRECISION=FP32 build), state_%08d_00000.bin (AdamW m, v, our fp32
parameters as master weights, llm.c's loader state at our data position), jaxtrain_export_%08d.json
(the sha256 of what it wrote, so that a later --force replaces only an export's files, never
train_gpt2cu's), jaxtrain_data_%08d.json (the training data's identity the step recorded, which our
resume checks) and DONE_%08d, last, which `train_gpt2cu -y 1 -o DIR` resumes.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from jaxtrain.checkpoint.format import Snapshot
from jaxtrain.checkpoint.formats.infinitrain.trainer import model_header
from jaxtrain.checkpoint.formats.llmc_run.inspection import KIND
from jaxtrain.checkpoint.layout import CheckpointError, kept_steps, later_steps
from jaxtrain.optim.optimizer import adam_states
from llmc_io import llmc_run
from llmc_io.errors import LLMCFormatError
from llmc_io.llmc_state import LLMCState, state_path, tree_to_flat


def refuse_unless_llmc_run(config) -> None:
    """What train_gpt2cu can continue: GPT-2, AdamW with its moments saved, llm.c's order, one process."""
    for key, want in (('model_family', 'gpt2'), ('optimizer', 'adamw'), ('shuffle', 'llmc')):
        if config.get(key) != want:
            raise CheckpointError(
                f'checkpoint_format llmc: {key}: expected {want!r} (what train_gpt2cu continues), found '
                f'{config.get(key)!r}; pass --{key} {want} or save as orbax'
            )
    if not config.get('save_optimizer_state', True):
        raise CheckpointError(
            "checkpoint_format llmc: save_optimizer_state: expected true (llm.c's state file holds AdamW's "
            'm and v), found false; pass --save_optimizer_state true or save as orbax'
        )
    if jax.process_count() > 1:
        raise CheckpointError(
            f'checkpoint_format llmc: saves from one process only, found {jax.process_count()}; save as '
            'orbax and convert a step with python -m jaxtrain.ckpt export STEP --format llmc-run --output DIR'
        )


class LLMCRunCheckpointer:
    """A format.RunCheckpointer writing llm.c run-folder steps, synchronously."""

    synchronous = True

    def __init__(self, config, parts, protected_steps=()):
        from jaxtrain.data.stream import data_paths, train_stream

        refuse_unless_llmc_run(config)
        self.root = Path(config.checkpoint_dir).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        # A save killed mid-file left its temporary; this run holds the root's lock, so none is live.
        llmc_run.remove_stale_temporaries(self.root)
        self.parts, self.header = parts, model_header('gpt2', parts.setup.model_config)
        self.stream = train_stream(
            config, parts.geometry, parts.setup.model_config.vocab_size, data_paths(config)[0]
        )
        self.keep_latest, self.keep_every = config.max_checkpoint_keep, config.keep_every_steps
        self.protected = {s for s in (*protected_steps, self._resumed_step(config)) if s is not None}
        self.set_aside, self.linked = [], []
        self.blocking_saves = 0

    def _resumed_step(self, config) -> int | None:
        """The step of this folder the run resumed from (kept out of rotation), if any: the caller's
        protected steps name step directories, and an llm.c step is a model file."""
        resume_from = config.get('resume_from', '')
        if not resume_from:
            return None
        named = llmc_run.split_model_path(resume_from)
        run_dir, step = named if named else (Path(resume_from), None)
        if resume_from == 'latest' or run_dir.absolute() == self.root:
            steps = llmc_run.committed_steps(self.root)
            return step if step is not None else (steps[-1] if steps else None)
        return None

    def step_dir(self, step: int) -> Path:
        return llmc_run.model_path(self.root, step)

    def refuse_later_steps(self, start_step: int, overwrite: bool) -> list[int]:
        later = later_steps(self.root, llmc_run.committed_steps(self.root), start_step, overwrite)
        for step in later:
            self._delete(step)
        return later

    def prepare(self, params, opt_state, rng):
        pass  # synchronous: nothing to compile ahead

    def snapshot(self, params, opt_state, rng) -> Snapshot:
        return Snapshot({'params': params, 'opt_state': opt_state, 'rng': rng}, None, copied=False)

    def save_snapshot(self, step: int, snapshot: Snapshot, trainer_state: dict):
        items = snapshot.items
        self.save(step, items['params'], items['opt_state'], items['rng'], trainer_state)

    def save(self, step: int, params, opt_state, rng, trainer_state: dict):
        found = adam_states(opt_state) if opt_state is not None else []
        if not found:
            raise CheckpointError(
                'checkpoint_format llmc: expected the AdamW moments to save (llm.c\'s state holds m and v), '
                'found no optimizer state; pass --save_optimizer_state true'
            )
        adam = jax.device_get(found[0])
        numpy_params = jax.tree.map(np.asarray, jax.device_get(params))
        shard, sample, shuffle = self.stream.loader_state(int(trainer_state['data_position']))
        where = state_path(self.root, step)
        state = LLMCState(
            step=step,
            current_shard_idx=shard,
            current_sample_idx=sample,
            shuffle=shuffle,
            m=tree_to_flat(where, jax.tree.map(np.asarray, adam.mu), self.header),
            v=tree_to_flat(where, jax.tree.map(np.asarray, adam.nu), self.header),
            master=tree_to_flat(where, numpy_params, self.header),
        )
        try:
            llmc_run.write_step(
                self.root, self.header, numpy_params, state, version=5, data=trainer_state.get('data')
            )
        except (OSError, LLMCFormatError) as e:
            raise CheckpointError(
                f'checkpoint_dir: {self.root}: could not save step {step}: {e}; earlier steps are intact. '
                'Free space, then resume.'
            ) from e
        self.blocking_saves += 1
        self._rotate()

    def _rotate(self):
        steps = llmc_run.committed_steps(self.root)
        kept = kept_steps(steps, self.keep_latest, self.keep_every, self.protected)
        for step in steps:
            if step not in kept:
                self._delete(step)

    def _delete(self, step: int):
        for path in (
            llmc_run.done_path(self.root, step),
            llmc_run.model_path(self.root, step),
            state_path(self.root, step),
            llmc_run.data_record_path(self.root, step),
        ):
            path.unlink(missing_ok=True)

    def between_steps(self) -> None:
        """Nothing: a save is written before save() returns."""

    def wait(self):
        pass

    def abort_notice(self) -> str:
        steps = llmc_run.committed_steps(self.root)
        newest = (
            f'the newest committed step is {steps[-1]} in {self.root}' if steps else f'no step in {self.root}'
        )
        return f'every save started was committed; {newest}; steps trained after it are lost'

    def close(self):
        pass


# --- ckpt export --format llmc-run ---


def _check_step_output(output: Path, step: int, force: bool, step_dir, recorded_base: str) -> None:
    """No step-`step` files in `output`, or (with --force) only files an earlier export wrote:
    llm.c's own files and a run's are never replaced (llmc_run.not_written_by_export)."""
    from jaxtrain.checkpoint.export_target import refuse_base_file
    from llmc_io.output_file import holds_step_dirs

    if holds_step_dirs(output):
        raise CheckpointError(
            f'--output: {output}: expected an llm.c run folder (or a new or empty one), found a checkpoint '
            'or a checkpoint root; --force never writes into one: choose another --output'
        )
    refuse_base_file(llmc_run.model_path(output, step), step_dir, recorded_base, '')
    existing = [p.name for p in llmc_run.step_files(output, step)]
    if existing and not force:
        raise CheckpointError(
            f'--output: {output}: expected no step-{step} files, found {", ".join(existing)}; they are '
            'left as they are (pass --force to replace files an earlier export wrote)'
        )
    foreign = llmc_run.not_written_by_export(output, step) if existing else []
    if foreign:
        raise CheckpointError(
            f'--output: {output}: expected (with --force) step-{step} files that ckpt export wrote, found '
            f'{", ".join(foreign)}, which train_gpt2cu or a run wrote (or changed since: '
            f'{llmc_run.export_record_path(output, step).name} does not vouch for them); they are left as '
            'they are: choose another --output, or move them away yourself'
        )


def export(step_dir, output, force: bool = False, version: int = 5) -> dict:
    """Write step_dir (one of our Orbax steps) into the llm.c run folder `output`: the model as
    version 5 (bf16, train_gpt2cu's default build) or 3 (fp32, a PRECISION=FP32 build)."""
    from jaxtrain.data.stream import LLMCShuffledStream
    from jaxtrain.checkpoint.formats.infinitrain.export import state_from_orbax
    from jaxtrain.checkpoint.formats.infinitrain.inspection import kind_of

    if kind_of(step_dir) != 'orbax':
        raise CheckpointError(
            f'{step_dir}: expected one of our (Orbax) checkpoints for --format llmc-run, found a '
            f'{kind_of(step_dir)} one; '
            'resume it with the trainer and save as orbax first'
        )
    from jaxtrain.checkpoint.trainer_state import read_trainer_state
    from jaxtrain.checkpoint.formats.orbax.inspection import find_step_dir

    # Where it would write, before the arrays are read: a refusal costs nothing.
    listed = read_trainer_state(find_step_dir(step_dir))
    _check_step_output(Path(output), int(listed['step']), force, step_dir, listed.get('llmc_file', ''))
    family, params, moments, record, header = state_from_orbax(step_dir)
    if family != 'gpt2':
        raise CheckpointError(f'{step_dir}: model_family: expected gpt2 (train_gpt2cu), found {family}')
    if moments is None:
        raise CheckpointError(
            f'{step_dir}: opt_state: expected AdamW moments (llm.c\'s state file holds m and v), found none; '
            'save with --save_optimizer_state'
        )
    step = int(record['step'])
    output = Path(output)
    training = record.get('training_config', {})
    mu, nu, t = moments
    if t != step:
        raise CheckpointError(
            f'{step_dir}: Adam t: expected the step {step} (llm.c takes t = step + 1 next), found {t}'
        )
    position = int(record['data_position'])
    shuffle = training.get('shuffle', 'none')
    pattern = training.get('input_bin', '')
    if shuffle != 'llmc':
        raise CheckpointError(
            f"{step_dir}: training_config.shuffle: expected 'llmc' (train_gpt2cu reads its permuted order), "
            f"found {shuffle!r}; train with --shuffle llmc to continue the run in llm.c"
        )
    tokens = int(record['tokens_per_step'])
    micro = training['batch_size'] * training['sequence_length']
    mesh = record.get('topology', {}).get('mesh', {})
    data_parallel = mesh.get('data', 1) * mesh.get('fsdp', 1)
    accumulation = tokens // (micro * data_parallel)
    stream = LLMCShuffledStream(
        pattern, tokens, training['sequence_length'], header.vocab_size, accumulation=accumulation
    )
    shard_idx, sample_idx, shuffle_state = stream.loader_state(position)
    state = LLMCState(
        step=step,
        current_shard_idx=shard_idx,
        current_sample_idx=sample_idx,
        m=tree_to_flat(output, mu, header),
        v=tree_to_flat(output, nu, header),
        master=tree_to_flat(output, params, header),
        shuffle=shuffle_state,
        rng_state=int(record.get('llmc_rng_state', 13371337)),
        rng_state_last_update=int(record.get('llmc_rng_state_last_update', 13371337)),
    )
    try:
        llmc_run.write_step(
            output,
            header,
            params,
            state,
            version=version,
            exported_from=str(step_dir),
            data=record.get('data'),
        )
    except (OSError, LLMCFormatError) as e:
        raise CheckpointError(
            f'--output: {output}: step {step} not written and left uncommitted (no DONE_{step:08d}): {e}'
        ) from None
    return {
        'output': str(output),
        'kind': KIND,
        'step': step,
        'model_family': family,
        'version': version,
        'files': [f'model_{step:08d}.bin', f'state_{step:08d}_00000.bin', f'DONE_{step:08d}'],
        'data': pattern,
        'llmc_flags': f"-b {micro * data_parallel // training['sequence_length']} "
        f"-t {training['sequence_length']} -d {tokens}",
        'later_steps': [s for s in llmc_run.committed_steps(output) if s > step],
    }


def export_line(written: dict) -> str:
    return (
        f"wrote {written['output']}: llm.c run folder, step {written['step']} "
        f"({', '.join(written['files'])}; model version {written['version']}"
        f"{' fp32, for a PRECISION=FP32 build' if written['version'] == 3 else ' bf16'}); "
        f"llm.c resumes it with train_gpt2cu -i '{written['data']}' {written['llmc_flags']} -y 1 -o "
        f"{written['output']}"
        + (
            f"; note: -y 1 resumes the newest committed step, {written['later_steps'][-1]}, not this one: "
            'move the later steps away first'
            if written['later_steps']
            else ''
        )
    )


def write(fmt, args) -> tuple[dict, str]:
    """`ckpt export --format llmc-run`: (what was written, for --json; the line for people)."""
    written = export(args.step_dir, args.output, args.force, args.version or 5)
    return {'path': str(args.step_dir), **written}, export_line(written)
