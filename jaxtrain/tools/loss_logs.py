"""Reading loss logs and comparing them step by step (the rules: compare_loss.py's docstring)."""

from __future__ import annotations

import dataclasses
import math
import re
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


# Logs of a run that are not training logs, as InfiniTrain's scripts/compare_utils.py collect_log_files skips
# them (b24d92f: build*, ctest_*, *_profile.log; PR 173, d81f568: the run's run_metadata.log).
_NOT_TRAINING_LOGS = ("run_metadata.log",)


def collect_log_files(directory: Path) -> dict[str, Path]:
    """The training logs under `directory` (any depth, as upstream's rglob; PR 173 writes them under
    <date>/<branch>_<commit>/logs) by basename; two with one basename cannot be paired safely."""
    files: dict[str, Path] = {}
    for path in sorted(directory.rglob("*.log")):
        name = path.name
        skipped = name.startswith(("build", "ctest_")) or name.endswith("_profile.log")
        if name in _NOT_TRAINING_LOGS or skipped:
            continue
        if name in files:
            raise UsageError(
                f"{str(directory)!r} holds two logs named {name!r} ({files[name].relative_to(directory)}, "
                f"{path.relative_to(directory)}); they cannot be paired by basename: "
                "compare their directories"
            )
        files[name] = path
    return files


def pair_log_files(
    base_dir: Path, test_dir: Path
) -> tuple[list[tuple[str, Path, Path]], list[str], list[str]]:
    """Pairs `*.log` files by basename; returns (pairs, names only in BASE, names only in TEST)."""
    base_files = collect_log_files(base_dir)
    test_files = collect_log_files(test_dir)
    common = sorted(base_files.keys() & test_files.keys())
    pairs = [(name, base_files[name], test_files[name]) for name in common]
    return pairs, sorted(base_files.keys() - test_files.keys()), sorted(test_files.keys() - base_files.keys())


# ---------------------------------------------------------------------------------------------
# Reporting
