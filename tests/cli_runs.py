"""The trainer's command line run in this process, and a digest of a directory tree.

`run_cli(*args)` goes through `jaxtrain.main.entry_point()` exactly as
`python -m jaxtrain.main ARGS` does (absl's app.run, the flag parser, main()), so an
error test sees the real exit code and stderr, without paying a process start (~3 s of
imports) per case. absl flags are global, so each call undoes the previous parse: the
plain flags are reset and the `--config.KEY` override flags that ml_collections defined
for the last command line are removed (it defines them again, and refuses duplicates).
"""

import contextlib
import dataclasses
import hashlib
import io
import os
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def _forget_previous_command_line(flag_values):
    for name in list(flag_values):
        if name.startswith('config.'):
            delattr(flag_values, name)
    flag_values.unparse_flags()


def run_cli(*args, config='configs/gpt2.py', flags_parser=None, num_devices=1) -> CliResult:
    """Runs `python -m jaxtrain.main --config=CONFIG --num_devices 1 ARGS` in this process.

    One device, as a user's CPU run has (the tests' 8 fake devices would change the batch
    split); `num_devices=None` leaves the flag out. `config=None` leaves --config out of the
    command line. `flags_parser` runs main() under app.run with that parser instead of
    entry_point()'s own.
    """
    from absl import app, flags

    from jaxtrain import main as cli

    argv = ['jaxtrain.main']
    if config:
        argv.append(f'--config={REPO / config}')  # an absolute config stays as it is
    argv += (['--num_devices', str(num_devices)] if num_devices is not None else []) + list(map(str, args))
    _forget_previous_command_line(flags.FLAGS)
    saved_argv, saved_xla_flags = sys.argv, os.environ.get('XLA_FLAGS')
    out, err = io.StringIO(), io.StringIO()
    sys.argv = argv  # ml_collections finds the --config.KEY overrides in sys.argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if flags_parser is None:
                    cli.entry_point()
                else:
                    app.run(lambda argv: sys.exit(cli.main(argv)), flags_parser=flags_parser)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # noqa: BLE001  what the interpreter does with an uncaught one
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = saved_argv
        # A later test's config checks ask absl whether a flag was given: not this command line's.
        _forget_previous_command_line(flags.FLAGS)
        # main() may add the deterministic-GPU flag; later subprocesses must not inherit it.
        if saved_xla_flags is None:
            os.environ.pop('XLA_FLAGS', None)
        else:
            os.environ['XLA_FLAGS'] = saved_xla_flags
    return CliResult(code, out.getvalue(), err.getvalue())


def tree_digest(*roots) -> str:
    """sha256 over every path (relative to its root), file content and symlink target under
    the roots: equal digests before and after mean nothing was added, removed or changed."""
    digest = hashlib.sha256()
    for root in map(Path, roots):
        digest.update(f'root {root}\n'.encode())
        if not root.exists():
            continue
        for path in sorted(root.rglob('*')):
            digest.update(f'{path.relative_to(root)}\n'.encode())
            if path.is_symlink():
                digest.update(os.readlink(path).encode())
            elif path.is_file():
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def seed_experiment_setup(tmp_path, family: str, dtype: str) -> tuple[list, str]:
    """The seed experiment's inputs for `family`: a random token shard and a tiny llm.c model
    under tmp_path, the flags both runs share (100 steps, a save every 20 with the optimizer
    state, 10 kept) and the log file name that compare_loss pairs across tmp_path/base and
    tmp_path/test (made here)."""
    from trainer_runs import random_shard, tiny_llmc_model

    train_bin = random_shard(tmp_path / 'TRAIN.bin', kind=family, num_tokens=60_000)
    model_bin = tiny_llmc_model(tmp_path / 'MODEL.bin', family)
    common = [
        '--input_bin', train_bin, '--llmc_filepath', model_bin, '--num_iteration', 100,
        '--save_steps', 20, '--save_optimizer_state', 'true', '--max_checkpoint_keep', 10,
        '--dtype', dtype,
    ]  # fmt: skip
    (tmp_path / 'base').mkdir(), (tmp_path / 'test').mkdir()
    return common, f"{family}{'_bfloat16' if dtype == 'bfloat16' else ''}.log"


def assert_resumed_run_matches(logs_base, logs_test, final_a, final_b) -> None:
    """The seed experiment's two checks, as its README commands make them, through the tools'
    main() in this process (README's own block runs them as commands): InfiniTrain-style
    compare_loss with zero thresholds (60 steps compared, all equal) and `ckpt diff` of the
    two runs' final checkpoints (identical)."""
    from jaxtrain.tools import ckpt, compare_loss

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = compare_loss.main(
            [str(logs_base), str(logs_test), '--threshold-fp32', '0', '--threshold-bf16', '0']
        )
    assert code == 0, out.getvalue()
    assert '60/60' in out.getvalue(), out.getvalue()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = ckpt.main(['diff', str(final_a), str(final_b)])
    assert code == 0, out.getvalue() + err.getvalue()
