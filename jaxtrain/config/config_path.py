"""`--config=configs/gpt2.py[:variant]` from any directory: a relative config path that is
not there from the working directory is looked up in the repository (the directory above
the jaxtrain package, where configs/ lives in a checkout or an editable install)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _resolved(value: str) -> str:
    path, colon, variant = value.partition(':')
    if not path or Path(path).is_absolute() or Path(path).exists():
        return value
    in_repo = REPO / path
    return f'{in_repo}{colon}{variant}' if in_repo.is_file() else value


def resolve_config_argument(argv: list[str]) -> list[str]:
    """argv with the value of `--config=PATH` / `--config PATH` resolved as above."""
    out, after_flag = [], False
    for arg in argv:
        if after_flag:
            arg, after_flag = _resolved(arg), False
        elif arg in ('--config', '-config'):
            after_flag = True
        elif arg.startswith(('--config=', '-config=')):
            name, value = arg.split('=', 1)
            arg = f'{name}={_resolved(value)}'
        out.append(arg)
    return out
