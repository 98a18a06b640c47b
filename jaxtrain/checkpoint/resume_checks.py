"""What a resume checks besides the model and optimizer settings (trainer_state.py): the
training data is the one the checkpoint was trained on, and --llmc_filepath, which a
resume does not take weights from, is named as such.

Data that differs is refused: the saved data position would address other tokens. With
accept_changed_data the run goes on, and the log says what changed.
"""

import functools
import os
from pathlib import Path

from jaxtrain.checkpoint.layout import TRAINER_STATE_FILE, CheckpointError
from jaxtrain.checkpoint.trainer_state import file_sha256
from jaxtrain.data.identity import identity_differences, run_data_identity


@functools.lru_cache(maxsize=4)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def cached_sha256(path: str) -> str:
    """file_sha256, once per file version in a process (the saver hashes the same file)."""
    stat = os.stat(path)
    return _sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def check_data(saved: dict, config, step_dir, recorded_in=None) -> list[str]:
    """Log lines; raises CheckpointError for changed data unless accept_changed_data.
    `recorded_in`: the file holding saved['data'] (default: the step's trainer state)."""
    if 'data' not in saved:  # saved before the data's identity was recorded
        return [f'resume: {step_dir} does not record its data; not checked']
    different, moved = identity_differences(saved['data'], run_data_identity(config))
    recorded_in = recorded_in or Path(step_dir) / TRAINER_STATE_FILE
    lines = [f'resume: data moved: {clause}' for clause in moved]
    if different and not config.accept_changed_data:
        raise CheckpointError(
            f'{step_dir}: data: expected the training data this checkpoint was trained on, found '
            + '; '.join(different)
            + f'. Resume with that data (listed under "data" in {recorded_in}), '
            'or pass --accept_changed_data true to train on this data from the saved position.'
        )
    lines += [f'resume: accept_changed_data: training on changed data: {clause}' for clause in different]
    return lines


def check_weights_file(saved: dict, config, step_dir) -> list[str]:
    """--llmc_filepath on a resume sets the model's shape; the weights are the checkpoint's.
    A LoRA checkpoint holds only adapters: its base weights do come from the file, and
    lora_record.py refuses a base whose sha256 differs, so there is nothing to say here."""
    if not config.llmc_filepath or saved.get('lora'):
        return []
    lines = [
        f'resume: the weights come from the checkpoint {step_dir}; --llmc_filepath '
        f'{config.llmc_filepath} only sets the model shape'
    ]
    recorded = saved.get('llmc_sha256')
    if recorded and os.path.isfile(config.llmc_filepath):
        found = cached_sha256(config.llmc_filepath)
        if found != recorded:
            lines.append(
                f"resume: warning: --llmc_filepath {config.llmc_filepath}: sha256 {found[:16]}… differs "
                f"from the file the checkpoint started from ({saved.get('llmc_file') or '?'}, sha256 "
                f'{recorded[:16]}…)'
            )
    return lines
