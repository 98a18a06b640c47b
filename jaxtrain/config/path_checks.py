"""Refuses paths of the wrong kind before anything runs: a checkpoint or metrics directory
that names a file (the run would train, then fail at its first save), data or a model file
that names a directory (a bare `[Errno 21]` otherwise). One line each: the key, what was
expected, what was found, what to do."""

import glob
import os
from pathlib import Path

# Keys naming a directory the run creates or fills.
DIRECTORY_KEYS = ('checkpoint_dir', 'metrics_dir', 'tensorboard_dir', 'trace_dir')
# Keys naming files: a glob of shards, or one file.
SHARD_GLOB_KEYS = ('input_bin', 'input_val_bin')
FILE_KEYS = ('llmc_filepath',)
# Keys naming a file the run writes at its end: checked now, or the run would train and then lose it.
OUTPUT_FILE_KEYS = ('lora_save_path',)


def _file_in_the_way(path: Path) -> Path | None:
    """The path itself or the nearest existing parent, when that is not a directory."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def path_problems(config) -> list[str]:
    problems = []
    for key in DIRECTORY_KEYS:
        if not config[key]:
            continue
        blocker = _file_in_the_way(Path(config[key]).absolute())
        if blocker is not None:
            # The path first, as root_access.py's checks of the same key word it.
            problems.append(
                f'{key}: {config[key]}: expected a directory (or a path to create), found that {blocker} is '
                f'a file; pass a directory to --{key}'
            )
    for key in SHARD_GLOB_KEYS:
        pattern = config[key]
        if not pattern:
            continue
        named = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        directories = [p for p in named if os.path.isdir(p)]
        if directories:
            example = os.path.join(directories[0], '*.bin')
            problems.append(
                f"{key}: expected llm.c token shard files, found the directory {directories[0]}; pass a glob "
                f"of the shards in it, e.g. --{key} '{example}'"
            )
    for key in FILE_KEYS:
        if config[key] and os.path.isdir(config[key]):
            problems.append(f'{key}: expected an llm.c model file, found the directory {config[key]}')
    for key in OUTPUT_FILE_KEYS:
        if config.get(key):
            problems += _output_file_problems(key, Path(config[key]))
    return problems


def _output_file_problems(key: str, path: Path) -> list[str]:
    parent = path.absolute().parent
    if path.is_dir():
        problem = (
            f'{key}: {path}: expected a file to write, found a directory; name a file in it, e.g. '
            f'--{key} {path / "lora.bin"}'
        )
    elif not parent.is_dir():
        problem = (
            f'{key}: {path}: expected a file in an existing directory, found no directory {parent}; '
            f'create it first (mkdir -p {parent})'
        )
    elif not os.access(parent, os.W_OK):
        problem = (
            f'{key}: {path}: expected a directory this user can write, found {parent} read-only; '
            'choose another path'
        )
    else:
        return []
    return [problem]
