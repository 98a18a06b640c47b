"""Compare the per-step training loss of two runs, InfiniTrain style.

Usage:
    python -m jaxtrain.compare_loss BASE TEST [--threshold-fp32 1e-5] [--threshold-bf16 1e-2]
                                    [--dtype auto|fp32|bf16] [--json] [--plot out.png]

BASE and TEST are two log files, or two directories whose `*.log` files, at any depth, are paired by
basename (`gpt2_1.log` with `gpt2_1.log`); as upstream's scripts/compare_utils.py, build*, ctest_*,
*_profile.log and run_metadata.log are not training logs, and two logs of one name are refused. A
loss is read from every line that contains `step   41/100 | train loss 3.123456`, whatever comes
before it (glog prefixes included); this is the line both InfiniTrain and jaxtrain print.
InfiniTrain's scripts/compare_loss.py reads the number with `[\\d.]+`, which silently drops `nan`,
`inf` and `1e+01`; here they are read, so a diverged run shows up as a mismatch instead of vanishing
from the comparison.

Rules (InfiniTrain's, plus resume handling):
  * A pair is bf16 when `_bfloat16` is in a file name, and then passes at |base - test| <= 1e-2;
    otherwise it is fp32 and passes at 1e-5. `--dtype` forces one class for every pair.
  * A step logged on one side only is a mismatch, and a non-finite loss never matches.
  * If TEST starts at step s0 later than BASE's first step, TEST was resumed from a checkpoint:
    BASE's steps before s0 are listed as "not in test (resumed at step s0)" and do not count.
  * If a log holds a step twice (a resumed run appended to it), the last occurrence is used.

Exit status: 0 when every compared step of every pair matches; 1 on a mismatch, a missing step,
a pair with nothing to compare, or a log present on one side only; 2 on a usage error.

Examples:
    python -m jaxtrain.compare_loss runs/infinitrain/logs runs/jaxtrain/logs
    python -m jaxtrain.compare_loss base/gpt2_1.log resumed/gpt2_1.log --plot loss.png
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from jaxtrain.tools.loss_logs import (
    BF16_NAME_MARKER,
    DEFAULT_THRESHOLDS,
    EXIT_MATCH,
    EXIT_MISMATCH,
    EXIT_USAGE,
    PairResult,
    UsageError,
    compare_logs,
    dtype_of,
    pair_log_files,
    parse_log,
)
from jaxtrain.tools.command_line import program_name, reader_gone
from jaxtrain.tools.loss_report import format_report, to_json, write_plot


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name("python -m jaxtrain.compare_loss"),
        description="Compare per-step training loss of two runs (log files or directories of *.log "
        "files paired by basename), using InfiniTrain's thresholds.",
        epilog="Exit status: 0 all compared steps match, 1 mismatch / missing step / unpaired file, "
        "2 usage error.",
    )
    parser.add_argument("base", type=Path, help="reference log file, or directory of *.log files")
    parser.add_argument(
        "test", type=Path, help="log file or directory to check against BASE (same kind as BASE)"
    )
    parser.add_argument(
        "--threshold-fp32",
        type=float,
        default=DEFAULT_THRESHOLDS["fp32"],
        metavar="ABS",
        help="largest allowed |base - test| for fp32 runs (default: %(default).0e)",
    )
    parser.add_argument(
        "--threshold-bf16",
        type=float,
        default=DEFAULT_THRESHOLDS["bf16"],
        metavar="ABS",
        help="largest allowed |base - test| for bf16 runs, i.e. files with "
        f"'{BF16_NAME_MARKER}' in the name (default: %(default).0e)",
    )
    parser.add_argument(
        "--dtype",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help=f"threshold class: auto = bf16 when '{BF16_NAME_MARKER}' is in either file name, "
        "else fp32; fp32 or bf16 forces it for every pair (e.g. for single files "
        "named without the suffix)",
    )
    parser.add_argument(
        "--no-resume-detection",
        dest="detect_resume",
        action="store_false",
        help="count BASE steps before TEST's first step as missing (mismatches) instead "
        "of treating TEST as resumed from a checkpoint",
    )
    parser.add_argument(
        "--max-mismatches",
        type=int,
        default=10,
        metavar="N",
        help="mismatching steps listed per file in the text report (default: %(default)s)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print the per-file detail for every pair, not only those that need a look",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a machine-readable JSON result instead of the text report"
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="OUT.png",
        help="write both loss curves and their difference to this PNG file (needs matplotlib)",
    )
    return parser


def _validate(args: argparse.Namespace) -> None:
    for flag, value in (("--threshold-fp32", args.threshold_fp32), ("--threshold-bf16", args.threshold_bf16)):
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} must be a finite number >= 0, got {value}")
    if args.max_mismatches < 0:
        raise UsageError(f"--max-mismatches must be >= 0, got {args.max_mismatches}")
    for side, path in (("BASE", args.base), ("TEST", args.test)):
        if not path.exists():
            raise UsageError(f"{side} {str(path)!r} does not exist")
    if args.base.is_dir() != args.test.is_dir():
        raise UsageError(
            f"BASE {str(args.base)!r} and TEST {str(args.test)!r} must both be files or both be directories"
        )


def run_comparison(args: argparse.Namespace) -> tuple[list[PairResult], list[str], list[str]]:
    thresholds = {"fp32": args.threshold_fp32, "bf16": args.threshold_bf16}
    if args.base.is_dir():
        pairs, only_in_base, only_in_test = pair_log_files(args.base, args.test)
        if not pairs and not only_in_base and not only_in_test:
            raise UsageError(f"no *.log files in {str(args.base)!r} or {str(args.test)!r}")
    else:
        same_name = args.base.name == args.test.name
        name = args.test.name if same_name else f"{args.base.name} vs {args.test.name}"
        pairs, only_in_base, only_in_test = [(name, args.base, args.test)], [], []

    results = []
    for name, base_path, test_path in pairs:
        dtype = dtype_of(base_path.name, test_path.name, override=args.dtype)
        results.append(
            compare_logs(
                name, parse_log(base_path), parse_log(test_path), dtype, thresholds[dtype], args.detect_resume
            )
        )
    return results, only_in_base, only_in_test


def main(argv: list[str] | None = None) -> int:
    try:
        return _compare(argv)
    except BrokenPipeError:  # `| head` has read what it wanted
        return reader_gone()


def _compare(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    thresholds = {"fp32": args.threshold_fp32, "bf16": args.threshold_bf16}
    try:
        _validate(args)
        results, only_in_base, only_in_test = run_comparison(args)
        if args.plot is not None:
            try:
                write_plot(results, args.plot)
            except ImportError as error:
                raise UsageError(f"--plot needs matplotlib and numpy: {error}") from None
            except OSError as error:
                raise UsageError(f"cannot write plot {str(args.plot)!r}: {error.strerror or error}") from None
    except UsageError as error:
        print(f"{program_name('python -m jaxtrain.compare_loss')}: error: {error}", file=sys.stderr)
        return EXIT_USAGE

    if args.json:
        print(to_json(results, only_in_base, only_in_test, args.base, args.test, thresholds, args.plot))
    else:
        print(
            format_report(
                results,
                only_in_base,
                only_in_test,
                args.base,
                args.test,
                thresholds,
                args.max_mismatches,
                args.verbose,
            )
        )
        if args.plot is not None:
            print(f"Plot written to {args.plot}")
    all_passed = all(result.passed for result in results) and not only_in_base and not only_in_test
    return EXIT_MATCH if all_passed else EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
