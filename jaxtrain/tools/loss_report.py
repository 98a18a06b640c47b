"""What compare_loss prints: the per-pair detail, the table, the JSON and the plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

from jaxtrain.tools.loss_logs import Mismatch, PairResult
from llmc_io.atomic_file import atomic_output


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
            f"Steps {_step_range_text(result.skipped_steps)}: not in test (resumed at step "
            f"{result.resumed_at})"
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


def _show_threshold(axes, threshold: float, differences) -> None:
    """The +/- threshold band, visible whatever the differences: around 0 when they are all 0
    (matplotlib would span +/-0.05 and draw it on the zero line), and beside one of 1e-3 (a
    linear axis would squash it there too). The axis is linear inside +/- threshold and
    logarithmic beyond (symlog), with limits of at least 4 thresholds."""
    import numpy as np

    finite = np.abs(differences[np.isfinite(differences)])
    largest = float(finite.max()) if finite.size else 0.0
    if threshold > 0:
        axes.set_yscale("symlog", linthresh=threshold)
        limit = max(4 * threshold, 2 * largest)
        band = f"within +/- {threshold:.0e}"
        axes.axhspan(-threshold, threshold, color="tab:green", alpha=0.12, label=band)
    else:  # an exact comparison: the band is the zero line itself
        limit = 2 * largest or 1.0
    for sign in (1, -1):
        axes.axhline(
            sign * threshold,
            color="tab:orange",
            linestyle="--",
            linewidth=1.2,
            label=f"threshold +/- {threshold:.0e}" if sign == 1 else None,
        )
    axes.set_ylim(-limit, limit)


def write_plot(results: list[PairResult], plot_path: Path) -> None:
    """The figure of plot_figure as a PNG."""
    figure = plot_figure(results)
    with atomic_output(plot_path) as f:  # a kill mid-plot leaves the earlier plot, not half a PNG
        figure.savefig(f, format="png", dpi=100)


def plot_figure(results: list[PairResult]):
    """One row per pair: both loss curves on the left, test - base on the right."""
    # Imported here so that comparing logs never needs matplotlib. Figure + the Agg canvas
    # instead of pyplot: no global backend state, and it works without a display.
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

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
        _show_threshold(diff_axes, result.threshold, differences)
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
        for axes in (loss_axes, diff_axes):
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        loss_axes.legend(fontsize="small")
        diff_axes.legend(fontsize="small")
    return figure


# ---------------------------------------------------------------------------------------------
# Command line
