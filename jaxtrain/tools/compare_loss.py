"""Compare the per-step training loss of two runs, InfiniTrain style.

Usage:
    python -m jaxtrain.compare_loss BASE TEST [--threshold-fp32 1e-5] [--threshold-bf16 1e-2]
                                    [--dtype auto|fp32|bf16] [--json] [--plot out.png]

BASE and TEST are two log files, or two directories whose `*.log` files are paired by basename
(`gpt2_1.log` with `gpt2_1.log`). A loss is read from every line that contains
`step   41/100 | train loss 3.123456`, whatever comes before it (glog prefixes included); this is
the line both InfiniTrain and jaxtrain print. InfiniTrain's scripts/compare_loss.py reads the
number with `[\\d.]+`, which silently drops `nan`, `inf` and `1e+01`; here they are read, so a
diverged run shows up as a mismatch instead of vanishing from the comparison.

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
import dataclasses
import json
import math
import re
import sys
from pathlib import Path

# InfiniTrain's pattern with the number widened to sign, exponent, nan and inf.
LOSS_LINE = re.compile(
    r"step\s+(\d+)/\d+\s+\|\s+train loss\s+"
    r"([-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?)))"
)
BF16_NAME_MARKER = "_bfloat16"
DEFAULT_THRESHOLDS = {"fp32": 1e-5, "bf16": 1e-2}
# Both sides are decimal strings with 6 places, so a difference that equals the threshold in
# decimal can land a few ulps above it in binary; it should still pass, as intended by `<=`.
THRESHOLD_SLACK = 1e-9
EXIT_MATCH, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A problem with the command line or the inputs; reported in one line, exit status 2."""


@dataclasses.dataclass
class LossLog:
    """The losses of one log file, keyed by the 1-based step printed in the line."""

    path: Path
    losses: dict[int, float]
    duplicate_steps: list[int]  # steps logged more than once; the last value was kept
    unparsed_lines: int  # lines that mention "train loss" but did not match LOSS_LINE

    @property
    def first_step(self) -> int | None:
        return min(self.losses) if self.losses else None

    @property
    def last_step(self) -> int | None:
        return max(self.losses) if self.losses else None


@dataclasses.dataclass
class Mismatch:
    step: int
    base_loss: float | None  # None: the step is missing from BASE
    test_loss: float | None  # None: the step is missing from TEST
    abs_diff: float | None


@dataclasses.dataclass
class PairResult:
    """The comparison of one BASE log with one TEST log."""

    name: str
    base: LossLog
    test: LossLog
    dtype: str  # "fp32" or "bf16"
    threshold: float
    compared_steps: int  # steps counted in "matched/compared", missing ones included
    matched_steps: int
    max_abs_diff: float | None
    max_abs_diff_step: int | None
    resumed_at: int | None  # TEST's first step when TEST was resumed from a checkpoint
    skipped_steps: list[int]  # BASE steps before resumed_at; not compared, not mismatches
    mismatches: list[Mismatch]

    @property
    def passed(self) -> bool:
        return self.compared_steps > 0 and not self.mismatches


def parse_log(path: Path) -> LossLog:
    """Reads every loss line of `path`; raises UsageError when the file cannot be read."""
    losses: dict[int, float] = {}
    duplicate_steps: set[int] = set()
    unparsed_lines = 0
    try:
        # errors="replace": a stray binary byte in a log must not hide the losses around it.
        with open(path, encoding="utf-8", errors="replace") as log_file:
            for line in log_file:
                match = LOSS_LINE.search(line)
                if match is None:
                    unparsed_lines += "train loss" in line
                    continue
                step = int(match.group(1))
                if step in losses:
                    duplicate_steps.add(step)
                losses[step] = float(match.group(2))
    except OSError as error:
        raise UsageError(f"cannot read log file {str(path)!r}: {error.strerror or error}") from None
    return LossLog(path, losses, sorted(duplicate_steps), unparsed_lines)


def dtype_of(*file_names: str, override: str = "auto") -> str:
    """InfiniTrain's rule: `_bfloat16` anywhere in a file name means a bf16 run."""
    if override != "auto":
        return override
    return "bf16" if any(BF16_NAME_MARKER in name for name in file_names) else "fp32"


def compare_logs(
    name: str, base: LossLog, test: LossLog, dtype: str, threshold: float, detect_resume: bool = True
) -> PairResult:
    """Compares two parsed logs step by step (see the module docstring for the rules)."""
    resumed_at = None
    skipped_steps: list[int] = []
    if detect_resume and base.losses and test.losses and test.first_step > base.first_step:
        resumed_at = test.first_step
        skipped_steps = sorted(step for step in base.losses if step < resumed_at)

    mismatches: list[Mismatch] = []
    compared_steps = matched_steps = 0
    max_abs_diff = max_abs_diff_step = None
    for step in sorted((base.losses.keys() | test.losses.keys()) - set(skipped_steps)):
        compared_steps += 1
        base_loss, test_loss = base.losses.get(step), test.losses.get(step)
        if base_loss is None or test_loss is None:
            mismatches.append(Mismatch(step, base_loss, test_loss, None))
            continue
        abs_diff = abs(base_loss - test_loss)
        # A NaN difference outranks every number: it is the most important thing to report.
        if max_abs_diff is None or (
            not math.isnan(max_abs_diff) and (math.isnan(abs_diff) or abs_diff > max_abs_diff)
        ):
            max_abs_diff, max_abs_diff_step = abs_diff, step
        finite = math.isfinite(base_loss) and math.isfinite(test_loss)
        if finite and abs_diff <= threshold * (1 + THRESHOLD_SLACK):
            matched_steps += 1
        else:
            mismatches.append(Mismatch(step, base_loss, test_loss, abs_diff))

    return PairResult(
        name,
        base,
        test,
        dtype,
        threshold,
        compared_steps,
        matched_steps,
        max_abs_diff,
        max_abs_diff_step,
        resumed_at,
        skipped_steps,
        mismatches,
    )


def pair_log_files(
    base_dir: Path, test_dir: Path
) -> tuple[list[tuple[str, Path, Path]], list[str], list[str]]:
    """Pairs `*.log` files by basename; returns (pairs, names only in BASE, names only in TEST)."""
    base_files = {path.name: path for path in base_dir.glob("*.log")}
    test_files = {path.name: path for path in test_dir.glob("*.log")}
    common = sorted(base_files.keys() & test_files.keys())
    pairs = [(name, base_files[name], test_files[name]) for name in common]
    return pairs, sorted(base_files.keys() - test_files.keys()), sorted(test_files.keys() - base_files.keys())


# ---------------------------------------------------------------------------------------------
# Reporting


def _loss_text(loss: float | None) -> str:
    return "missing" if loss is None else f"{loss:.6f}"


def _step_range_text(steps: list[int]) -> str:
    if not steps:
        return "none"
    return f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


def _max_diff_text(result: PairResult) -> str:
    if result.max_abs_diff is None:
        return "max abs diff n/a (no step on both sides)"
    return f"max abs diff {result.max_abs_diff:.2e} at step {result.max_abs_diff_step}"


def _mismatch_text(mismatch: Mismatch) -> str:
    if mismatch.base_loss is None:
        return f"Step {mismatch.step}: missing in base (test {_loss_text(mismatch.test_loss)})"
    if mismatch.test_loss is None:
        return f"Step {mismatch.step}: missing in test (base {_loss_text(mismatch.base_loss)})"
    values = f"{mismatch.base_loss:.6f} vs {mismatch.test_loss:.6f}"
    if not (math.isfinite(mismatch.base_loss) and math.isfinite(mismatch.test_loss)):
        return f"Step {mismatch.step}: {values} MISMATCH (non-finite loss)"
    largest = max(abs(mismatch.base_loss), abs(mismatch.test_loss))
    relative = mismatch.abs_diff / largest * 100 if largest > 0 else 0.0
    return f"Step {mismatch.step}: {values} MISMATCH (diff: {mismatch.abs_diff:.2e}, {relative:.4f}%)"


def _notes(result: PairResult) -> list[str]:
    """Things worth knowing about a pair that are not mismatches."""
    notes = []
    if result.resumed_at is not None:
        notes.append(
            f"Steps {_step_range_text(result.skipped_steps)}: not in test (resumed at step {result.resumed_at})"
        )
    for side, log in (("base", result.base), ("test", result.test)):
        if not log.losses:
            notes.append(f"{side}: no 'step N/M | train loss X' line found in {log.path}")
        if log.duplicate_steps:
            notes.append(
                f"{side}: {len(log.duplicate_steps)} step(s) logged more than once "
                f"({_step_range_text(log.duplicate_steps)}), the last occurrence is used"
            )
        if log.unparsed_lines:
            notes.append(f"{side}: {log.unparsed_lines} line(s) mention 'train loss' but could not be parsed")
    return notes


def format_pair_detail(result: PairResult, max_mismatches: int) -> list[str]:
    lines = [f"Comparing {result.name} ({result.dtype}, threshold: {result.threshold:.0e}):"]
    for side, log in (("base", result.base), ("test", result.test)):
        steps = sorted(log.losses)
        lines.append(f"  {side}: {log.path} (steps {_step_range_text(steps)}, {len(steps)} logged)")
    lines += [f"  {note}" for note in _notes(result)]
    lines += [f"  {_mismatch_text(mismatch)}" for mismatch in result.mismatches[:max_mismatches]]
    if len(result.mismatches) > max_mismatches:
        hidden = len(result.mismatches) - max_mismatches
        lines.append(f"  ... {hidden} more mismatch(es), raise --max-mismatches to list them")
    if result.compared_steps == 0:
        lines.append("  Summary: nothing to compare, counted as a failure")
    else:
        lines.append(
            f"  Summary: {result.matched_steps}/{result.compared_steps} compared steps matched, "
            f"{_max_diff_text(result)}"
        )
    return lines


def format_table(results: list[PairResult]) -> list[str]:
    header = ("file", "dtype", "threshold", "matched", "max abs diff", "at step", "resumed at", "result")
    rows = [header]
    for result in results:
        rows.append(
            (
                result.name,
                result.dtype,
                f"{result.threshold:.0e}",
                f"{result.matched_steps}/{result.compared_steps}",
                "-" if result.max_abs_diff is None else f"{result.max_abs_diff:.2e}",
                "-" if result.max_abs_diff_step is None else str(result.max_abs_diff_step),
                "-" if result.resumed_at is None else str(result.resumed_at),
                "PASS" if result.passed else "FAIL",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def format_report(
    results: list[PairResult],
    only_in_base: list[str],
    only_in_test: list[str],
    base_root: Path,
    test_root: Path,
    thresholds: dict[str, float],
    max_mismatches: int,
    verbose: bool,
) -> str:
    lines = []
    if only_in_base:
        lines.append(f"Files only in {base_root} (base): {', '.join(only_in_base)}")
    if only_in_test:
        lines.append(f"Files only in {test_root} (test): {', '.join(only_in_test)}")
    if only_in_base or only_in_test:
        lines.append("")
    # A single pair always gets its detail; in directory mode only the pairs that need a look.
    for result in results:
        if verbose or len(results) == 1 or not result.passed or _notes(result):
            lines += format_pair_detail(result, max_mismatches) + [""]
    if results:
        lines += format_table(results) + [""]

    counts = overall_counts(results)
    lines.append("=" * 50)
    lines.append("Overall Summary:")
    lines.append(
        f"  fp32:     {counts['fp32']['passed']}/{counts['fp32']['total']} test cases passed "
        f"(threshold: {thresholds['fp32']:.0e})"
    )
    lines.append(
        f"  bfloat16: {counts['bf16']['passed']}/{counts['bf16']['total']} test cases passed "
        f"(threshold: {thresholds['bf16']:.0e})"
    )
    total_passed = counts["fp32"]["passed"] + counts["bf16"]["passed"]
    total = counts["fp32"]["total"] + counts["bf16"]["total"]
    unpaired = len(only_in_base) + len(only_in_test)
    lines.append(
        f"  Total:    {total_passed}/{total} test cases passed"
        + (f", {unpaired} file(s) without a partner" if unpaired else "")
    )
    lines.append("=" * 50)
    return "\n".join(lines)


def overall_counts(results: list[PairResult]) -> dict[str, dict[str, int]]:
    counts = {dtype: {"passed": 0, "total": 0} for dtype in ("fp32", "bf16")}
    for result in results:
        counts[result.dtype]["total"] += 1
        counts[result.dtype]["passed"] += result.passed
    return counts


def _json_number(value: float | None) -> float | str | None:
    # Strict JSON has no NaN/Infinity; spell them as strings so any parser accepts the output.
    if value is None or math.isfinite(value):
        return value
    return str(value)


def to_json(
    results: list[PairResult],
    only_in_base: list[str],
    only_in_test: list[str],
    base_root: Path,
    test_root: Path,
    thresholds: dict[str, float],
    plot_path: Path | None,
) -> str:
    files = []
    for result in results:
        files.append(
            {
                "name": result.name,
                "base": str(result.base.path),
                "test": str(result.test.path),
                "dtype": result.dtype,
                "threshold": result.threshold,
                "compared_steps": result.compared_steps,
                "matched_steps": result.matched_steps,
                "max_abs_diff": _json_number(result.max_abs_diff),
                "max_abs_diff_step": result.max_abs_diff_step,
                "resumed_at": result.resumed_at,
                "not_in_test_steps": result.skipped_steps,
                "duplicate_steps": {"base": result.base.duplicate_steps, "test": result.test.duplicate_steps},
                "unparsed_lines": {"base": result.base.unparsed_lines, "test": result.test.unparsed_lines},
                "mismatches": [
                    {
                        "step": mismatch.step,
                        "base": _json_number(mismatch.base_loss),
                        "test": _json_number(mismatch.test_loss),
                        "abs_diff": _json_number(mismatch.abs_diff),
                    }
                    for mismatch in result.mismatches
                ],
                "notes": _notes(result),
                "passed": result.passed,
            }
        )
    document = {
        "base": str(base_root),
        "test": str(test_root),
        "thresholds": thresholds,
        "only_in_base": only_in_base,
        "only_in_test": only_in_test,
        "files": files,
        "overall": overall_counts(results),
        "passed": all(result.passed for result in results) and not only_in_base and not only_in_test,
        "plot": None if plot_path is None else str(plot_path),
    }
    return json.dumps(document, indent=2, allow_nan=False)


# ---------------------------------------------------------------------------------------------
# Plotting


def write_plot(results: list[PairResult], plot_path: Path) -> None:
    """One row per pair: both loss curves on the left, test - base on the right."""
    # Imported here so that comparing logs never needs matplotlib. Figure + the Agg canvas
    # instead of pyplot: no global backend state, and it works without a display.
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 3.6 * max(1, len(results))), layout="constrained")
    FigureCanvasAgg(figure)
    axes_grid = figure.subplots(max(1, len(results)), 2, squeeze=False)
    for (loss_axes, diff_axes), result in zip(axes_grid, results):
        for label, log, style in (("base", result.base, "-"), ("test", result.test, "--")):
            steps = np.array(sorted(log.losses), dtype=np.int64)
            losses = np.array([log.losses[s] for s in steps], dtype=np.float64)
            losses[~np.isfinite(losses)] = np.nan  # a gap in the curve; the report names the step
            loss_axes.plot(steps, losses, style, label=f"{label}: {log.path.name}")
        loss_axes.set_title(f"{result.name}: train loss")
        loss_axes.set_xlabel("step")
        loss_axes.set_ylabel("loss")

        common_steps = np.array(sorted(result.base.losses.keys() & result.test.losses.keys()), dtype=np.int64)
        differences = np.array(
            [result.test.losses[s] - result.base.losses[s] for s in common_steps], dtype=np.float64
        )
        differences[~np.isfinite(differences)] = np.nan
        diff_axes.plot(common_steps, differences, ".-", color="tab:purple", label="test - base")
        compared_mismatches = [m for m in result.mismatches if m.abs_diff is not None]
        large_steps = [m.step for m in compared_mismatches if math.isfinite(m.abs_diff)]
        if large_steps:
            large_differences = [result.test.losses[s] - result.base.losses[s] for s in large_steps]
            diff_axes.plot(large_steps, large_differences, "x", color="tab:red", label="mismatch")
        # A non-finite difference has no place on the axis; mark its step on the zero line.
        non_finite_steps = [m.step for m in compared_mismatches if not math.isfinite(m.abs_diff)]
        if non_finite_steps:
            diff_axes.plot(
                non_finite_steps, np.zeros(len(non_finite_steps)), "v", color="black", label="non-finite loss"
            )
        for sign in (1, -1):
            diff_axes.axhline(
                sign * result.threshold,
                color="grey",
                linestyle=":",
                label=f"+/- threshold {result.threshold:.0e}" if sign == 1 else None,
            )
        diff_axes.set_title(f"{result.name}: difference ({result.dtype})")
        diff_axes.set_xlabel("step")
        diff_axes.set_ylabel("test - base")

        if result.resumed_at is not None:
            for axes in (loss_axes, diff_axes):
                axes.axvline(
                    result.resumed_at,
                    color="tab:green",
                    linestyle="-.",
                    label=f"resumed at step {result.resumed_at}",
                )
        loss_axes.legend(fontsize="small")
        diff_axes.legend(fontsize="small")
    figure.savefig(plot_path, format="png", dpi=100)


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jaxtrain.compare_loss",
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
        print(f"compare_loss: error: {error}", file=sys.stderr)
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
