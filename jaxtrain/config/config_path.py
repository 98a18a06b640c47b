"""`--config=configs/gpt2.py[:variant]` from any directory: a relative config path that is
not there from the working directory is looked up in the repository (the directory above
the jaxtrain package, where configs/ lives in a checkout or an editable install), then among
the configs shipped in the package (jaxtrain/configs/ of a non-editable install: pyproject.toml
maps configs/ there)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = Path(__file__).resolve().parents[1] / 'configs'


def _candidates(path: str):
    yield REPO / path
    if Path(path).parts[:1] == ('configs',):
        yield SHIPPED.joinpath(*Path(path).parts[1:])


def shipped_config(name: str) -> Path | None:
    """configs/NAME of this checkout or installed package, or None."""
    return next((c for c in _candidates(f'configs/{name}') if c.is_file()), None)


def _resolved(value: str) -> str:
    path, colon, variant = value.partition(':')
    if not path or Path(path).is_absolute() or Path(path).exists():
        return value
    found = next((c for c in _candidates(path) if c.is_file()), None)
    return f'{found}{colon}{variant}' if found else value


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
