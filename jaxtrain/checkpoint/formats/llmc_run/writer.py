"""`--checkpoint_format llmc`: the run saves into --checkpoint_dir as an llm.c run folder, each step
model_%08d.bin (v5 bf16), state_%08d_00000.bin and DONE_%08d, which `train_gpt2cu -y 1` resumes and
`--resume_from DIR` / `--resume_from latest` read back (llmc_run.py).

The state holds AdamW m and v, our fp32 parameters as master weights and llm.c's loader state at the
saved data position (replayed, so the run must read llm.c's order: --shuffle llmc). Saves are
synchronous; rotation keeps the newest max_checkpoint_keep steps, every multiple of keep_every_steps
and the step the run resumed from, deleting DONE first (as a step without it is not committed).
A save clears its step's DONE before writing (llmc_run.write_step), and a run starting removes the
temporaries a save killed mid-file left behind.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from jaxtrain.checkpoint.formats.infinitrain.trainer import model_header
from jaxtrain.optim.optimizer import adam_states
from jaxtrain.checkpoint.layout import kept_steps
from jaxtrain.checkpoint.layout import CheckpointError, later_steps
from jaxtrain.checkpoint.format import Snapshot
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
