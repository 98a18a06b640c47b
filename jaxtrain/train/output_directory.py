"""Creating a directory the run writes its logs into (--metrics_dir, --tensorboard_dir): a path the
run cannot create is one line naming the key, not a bare `[Errno 2]` or `[Errno 13]`.

The config checks refuse a path that is or lies under a file before anything runs; what only the
attempt can tell (a read-only or virtual file system) is told here, when the directory is made."""

from pathlib import Path


def create_output_directory(key: str, directory: str) -> Path:
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f'{key}: {directory}: expected a directory this run can create and write in, found '
            f'{error.strerror} (while creating it); pass another --{key}'
        ) from None
    return path
