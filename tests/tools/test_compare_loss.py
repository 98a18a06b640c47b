"""Tests for jaxtrain.compare_loss on hand-written InfiniTrain-format logs.

The logs are written here line by line in the exact format InfiniTrain prints through glog
(docs/formats.md section 6), so the parser is pinned to that format, not to our trainer's output.
Most tests call main() directly (fast); a few run the module as a subprocess to check the
command line end to end.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxtrain.tools import compare_loss
from jaxtrain.tools import loss_logs

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = Path("/work/venv/bin/python")
PYTHON = str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def infinitrain_line(step: int, total_steps: int, loss_text: str) -> str:
    """One InfiniTrain training line, glog prefix included; `loss_text` is printed as given."""
    return (
        f"E20250612 10:11:{step % 60:02d}.345678 4242 main.cc:471] "
        f"step {step:4d}/{total_steps} | train loss {loss_text} | lr 1.00e-04 | "
        f"(512.34 ms | 500 tok/s | peak used:  1234 MB | peak reserved:  2048 MB, DP=1, TP=1, SP=1, PP=1)"
    )


def reference_loss(step: int) -> float:
    return 4.283426 - 0.01 * step


def write_log(path: Path, steps, total_steps: int, loss_of=reference_loss, extra_lines=()) -> Path:
    """Writes an InfiniTrain log: glog noise, then one line per step with loss_of(step)."""
    lines = ["I20250612 10:11:00.000000 4242 main.cc:300] Loading model from gpt2_124M.bin"]
    for step in steps:
        loss = loss_of(step)
        loss_text = loss if isinstance(loss, str) else f"{loss:.6f}"
        lines.append(infinitrain_line(step, total_steps, loss_text))
    lines.extend(extra_lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "jaxtrain.compare_loss", *map(str, args)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def test_parser_reads_glog_prefixed_line_exactly(tmp_path):
    log = tmp_path / "gpt2_1.log"
    log.write_text(
        "E20250612 10:11:12.345678 4242 main.cc:471] step    1/10 | train loss 4.283426 | lr 1.00e-04 | "
        "(512.34 ms | 500 tok/s | peak used:  1234 MB | peak reserved:  2048 MB, DP=1, TP=1, SP=1, PP=1)\n"
        "step   41/100 | train loss 3.123456 | lr 1.00e-04 | (12.34 ms | 20745 tok/s | ...)\n"
        "step    2/10 | train loss 1.5e+01 | lr 1.00e-04\n"
        "step    3/10 | train loss -nan | lr 1.00e-04\n"
        "step    4/10 | train loss inf | lr 1.00e-04\n"
        "step    5/10 | val loss 2.0\n"
    )
    parsed = loss_logs.parse_log(log)
    assert parsed.losses[1] == 4.283426
    assert parsed.losses[41] == 3.123456
    assert parsed.losses[2] == 15.0
    assert parsed.losses[3] != parsed.losses[3]  # nan
    assert parsed.losses[4] == float("inf")
    assert 5 not in parsed.losses
    assert parsed.duplicate_steps == []


def test_identical_logs_match(tmp_path, capsys):
    base = write_log(tmp_path / "base" / "gpt2_1.log", range(1, 11), 10)
    test = write_log(tmp_path / "test" / "gpt2_1.log", range(1, 11), 10)
    assert compare_loss.main([str(base), str(test)]) == 0
    out = capsys.readouterr().out
    assert "10/10 compared steps matched" in out
    assert "max abs diff 0.00e+00" in out
    assert "fp32:     1/1 test cases passed" in out


def test_2e5_difference_fails_fp32_but_passes_bf16(tmp_path, capsys):
    def shifted(step):
        return reference_loss(step) + (2e-5 if step == 7 else 0.0)

    for name, expected_status in (("gpt2_1.log", 1), ("gpt2_1_bfloat16.log", 0)):
        base = write_log(tmp_path / "base" / name, range(1, 11), 10)
        test = write_log(tmp_path / "test" / name, range(1, 11), 10, loss_of=shifted)
        assert compare_loss.main([str(base), str(test)]) == expected_status
        out = capsys.readouterr().out
        if expected_status:
            assert "(fp32, threshold: 1e-05)" in out
            assert "Step 7: 4.213426 vs 4.213446 MISMATCH (diff: 2.00e-05" in out
            assert "9/10 compared steps matched, max abs diff 2.00e-05 at step 7" in out
        else:
            assert "(bf16, threshold: 1e-02)" in out
            assert "10/10 compared steps matched" in out

    # The same fp32-named files pass when --dtype forces the bf16 threshold, or with a looser flag.
    fp32_pair = [str(tmp_path / "base" / "gpt2_1.log"), str(tmp_path / "test" / "gpt2_1.log")]
    assert compare_loss.main([*fp32_pair, "--dtype", "bf16"]) == 0
    assert compare_loss.main([*fp32_pair, "--threshold-fp32", "3e-5"]) == 0
    capsys.readouterr()


def test_difference_equal_to_threshold_passes(tmp_path):
    base = write_log(tmp_path / "base.log", range(1, 4), 3, loss_of=lambda s: 3.123456)
    test = write_log(tmp_path / "test.log", range(1, 4), 3, loss_of=lambda s: 3.123466)
    assert compare_loss.main([str(base), str(test)]) == 0


def test_resumed_run_compares_only_steps_after_resume(tmp_path, capsys):
    base = write_log(tmp_path / "full" / "gpt2_1.log", range(1, 101), 100)
    test = write_log(tmp_path / "resumed" / "gpt2_1.log", range(41, 101), 100)
    assert compare_loss.main([str(base), str(test)]) == 0
    out = capsys.readouterr().out
    assert "Steps 1-40: not in test (resumed at step 41)" in out
    assert "60/60 compared steps matched" in out

    # Without resume detection the 40 leading steps are missing, hence mismatches.
    assert compare_loss.main([str(base), str(test), "--no-resume-detection"]) == 1
    assert "60/100 compared steps matched" in capsys.readouterr().out


def test_appended_log_uses_last_occurrence_and_says_so(tmp_path, capsys):
    base = write_log(tmp_path / "base" / "gpt2_1.log", range(1, 11), 10)
    # A first attempt logged steps 1-6 with wrong losses, crashed, and the resumed run
    # (from the step-4 checkpoint) appended steps 5-10 with the right ones.
    first_attempt = [
        infinitrain_line(s, 10, f"{reference_loss(s) + (0.5 if s > 4 else 0):.6f}") for s in range(1, 7)
    ]
    resumed = [infinitrain_line(s, 10, f"{reference_loss(s):.6f}") for s in range(5, 11)]
    test = tmp_path / "test" / "gpt2_1.log"
    test.parent.mkdir()
    test.write_text("\n".join(first_attempt + resumed) + "\n")

    assert compare_loss.main([str(base), str(test)]) == 0
    out = capsys.readouterr().out
    assert "test: 2 step(s) logged more than once (5-6), the last occurrence is used" in out
    assert "10/10 compared steps matched" in out


def test_missing_step_is_a_mismatch(tmp_path, capsys):
    base = write_log(tmp_path / "base" / "gpt2_1.log", range(1, 11), 10)
    test = write_log(tmp_path / "test" / "gpt2_1.log", [s for s in range(1, 11) if s != 6], 10)
    assert compare_loss.main([str(base), str(test)]) == 1
    out = capsys.readouterr().out
    assert "Step 6: missing in test (base 4.223426)" in out
    assert "9/10 compared steps matched" in out

    # A test run that stops early is missing its last steps, not "resumed".
    short = write_log(tmp_path / "short" / "gpt2_1.log", range(1, 9), 10)
    assert compare_loss.main([str(base), str(short)]) == 1
    assert "Step 10: missing in test" in capsys.readouterr().out


def test_log_without_loss_lines_fails(tmp_path, capsys):
    base = write_log(tmp_path / "base.log", range(1, 4), 3)
    test = write_log(tmp_path / "test.log", [], 3)
    assert compare_loss.main([str(base), str(test)]) == 1
    assert "test: no 'step N/M | train loss X' line found" in capsys.readouterr().out


def test_directories_pair_by_basename_and_report_unpaired(tmp_path, capsys):
    base_dir, test_dir = tmp_path / "base", tmp_path / "test"
    for name in ("gpt2_1.log", "llama3_1_bfloat16.log", "only_base.log"):
        write_log(base_dir / name, range(1, 11), 10)
    for name in ("gpt2_1.log", "llama3_1_bfloat16.log", "only_test.log"):
        write_log(test_dir / name, range(1, 11), 10)
    (test_dir / "notes.txt").write_text("not a log\n")

    assert compare_loss.main([str(base_dir), str(test_dir)]) == 1
    out = capsys.readouterr().out
    assert f"Files only in {base_dir} (base): only_base.log" in out
    assert f"Files only in {test_dir} (test): only_test.log" in out
    assert "fp32:     1/1 test cases passed" in out
    assert "bfloat16: 1/1 test cases passed" in out
    assert "2 file(s) without a partner" in out

    # With the unpaired files gone, the same directories pass.
    (base_dir / "only_base.log").unlink()
    (test_dir / "only_test.log").unlink()
    assert compare_loss.main([str(base_dir), str(test_dir)]) == 0
    out = capsys.readouterr().out
    table_rows = [
        line for line in out.splitlines() if line.startswith(("gpt2_1.log", "llama3_1_bfloat16.log"))
    ]
    assert len(table_rows) == 2 and all("10/10" in row and "PASS" in row for row in table_rows)


def test_nan_loss_is_reported_as_mismatch(tmp_path, capsys):
    base = write_log(tmp_path / "base" / "gpt2_1.log", range(1, 11), 10)
    test = write_log(
        tmp_path / "test" / "gpt2_1.log",
        range(1, 11),
        10,
        loss_of=lambda s: "nan" if s >= 8 else reference_loss(s),
    )
    assert compare_loss.main([str(base), str(test)]) == 1
    out = capsys.readouterr().out
    assert "Step 8: 4.203426 vs nan MISMATCH (non-finite loss)" in out
    assert "7/10 compared steps matched, max abs diff nan at step 8" in out


def test_json_output_parses(tmp_path, capsys):
    base = write_log(tmp_path / "base" / "gpt2_1.log", range(1, 101), 100)
    test = write_log(
        tmp_path / "test" / "gpt2_1.log",
        range(41, 101),
        100,
        loss_of=lambda s: "nan" if s == 100 else reference_loss(s),
    )
    assert compare_loss.main([str(base), str(test), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    (file_result,) = document["files"]
    assert document["passed"] is False
    assert file_result["resumed_at"] == 41
    assert file_result["not_in_test_steps"] == list(range(1, 41))
    assert (file_result["matched_steps"], file_result["compared_steps"]) == (59, 60)
    assert file_result["mismatches"] == [{"step": 100, "base": 3.283426, "test": "nan", "abs_diff": "nan"}]
    assert document["overall"]["fp32"] == {"passed": 0, "total": 1}


def test_plot_writes_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    base = write_log(tmp_path / "base" / "gpt2_1.log", range(1, 101), 100)
    test = write_log(
        tmp_path / "test" / "gpt2_1.log",
        range(41, 101),
        100,
        loss_of=lambda s: reference_loss(s) + (1e-4 if s == 50 else 0) if s < 99 else "nan",
    )
    plot_path = tmp_path / "loss.png"
    assert compare_loss.main([str(base), str(test), "--plot", str(plot_path)]) == 1
    assert f"Plot written to {plot_path}" in capsys.readouterr().out
    assert plot_path.read_bytes()[:8] == PNG_SIGNATURE


def test_usage_errors_exit_2_with_one_line(tmp_path, capsys):
    log = write_log(tmp_path / "base.log", range(1, 4), 3)
    assert compare_loss.main([str(log), str(tmp_path / "absent.log")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "absent.log" in error and "Traceback" not in error

    assert compare_loss.main([str(log), str(tmp_path)]) == 2  # a file against a directory
    assert "both be files or both be directories" in capsys.readouterr().err

    empty_a, empty_b = tmp_path / "empty_a", tmp_path / "empty_b"
    empty_a.mkdir(), empty_b.mkdir()
    assert compare_loss.main([str(empty_a), str(empty_b)]) == 2
    capsys.readouterr()

    with pytest.raises(SystemExit) as exit_info:  # argparse's own usage errors
        compare_loss.main([str(log)])
    assert exit_info.value.code == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a chmod 000 file")
def test_unreadable_file_exit_2(tmp_path, capsys):
    base = write_log(tmp_path / "base.log", range(1, 4), 3)
    test = write_log(tmp_path / "test.log", range(1, 4), 3)
    test.chmod(0)
    try:
        assert compare_loss.main([str(base), str(test)]) == 2
    finally:
        test.chmod(0o644)
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "test.log" in error


def test_unreadable_file_in_directory_exit_2(tmp_path):
    # A directory named like a log cannot be opened, whoever runs the test.
    write_log(tmp_path / "base" / "gpt2_1.log", range(1, 4), 3)
    (tmp_path / "test" / "gpt2_1.log").mkdir(parents=True)
    result = run_cli(tmp_path / "base", tmp_path / "test")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "gpt2_1.log" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_end_to_end(tmp_path):
    base = write_log(tmp_path / "full" / "gpt2_1.log", range(1, 101), 100)
    test = write_log(tmp_path / "resumed" / "gpt2_1.log", range(41, 101), 100)
    result = run_cli(base, test)
    assert result.returncode == 0, result.stderr
    assert "60/60 compared steps matched" in result.stdout

    result = run_cli(tmp_path / "full", tmp_path / "resumed", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"][0]["matched_steps"] == 60

    changed = write_log(
        tmp_path / "changed" / "gpt2_1.log", range(1, 101), 100, loss_of=lambda s: reference_loss(s) + 2e-5
    )
    assert run_cli(base, changed).returncode == 1


def test_cli_help():
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in ("--threshold-fp32", "--threshold-bf16", "--dtype", "--json", "--plot"):
        assert flag in result.stdout


def test_run_metadata_and_build_logs_are_skipped_and_logs_found_at_any_depth(tmp_path, capsys):
    # InfiniTrain's scripts/compare_utils.py: PR 173 (d81f568) writes run_metadata.log beside the logs, under
    # <date>/<branch>_<commit>/logs; it and build / ctest / profile logs are not training logs.
    base_dir, test_dir = tmp_path / "base", tmp_path / "test"
    write_log(base_dir / "2026-06-24" / "master_d81f568" / "logs" / "gpt2_1.log", range(1, 6), 5)
    (base_dir / "2026-06-24" / "master_d81f568" / "logs" / "run_metadata.log").write_text(
        "start_time: 2026-06-24 03:44:52\ngit_branch: master\ngit_commit: d81f568\n"
    )
    (base_dir / "build_gpt2.log").write_text("[100%] Built target gpt2\n")
    (base_dir / "gpt2_1_profile.log").write_text("profile\n")
    write_log(test_dir / "gpt2_1.log", range(1, 6), 5)
    assert compare_loss.main([str(base_dir), str(test_dir)]) == 0
    out = capsys.readouterr().out
    assert "run_metadata.log" not in out and "without a partner" not in out

    write_log(base_dir / "again" / "gpt2_1.log", range(1, 6), 5)
    assert compare_loss.main([str(base_dir), str(test_dir)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "two logs named 'gpt2_1.log'" in err


@pytest.mark.parametrize("spike", [0.0, 2e-3])
def test_threshold_lines_stand_apart_from_zero_on_the_difference_panel(tmp_path, spike):
    """A bitwise resume (every difference 0) and one far mismatch: on both, the +/- 1e-5 lines are
    drawn at least 30 pixels from the zero line (matplotlib's own scaling put them on it)."""
    pytest.importorskip("matplotlib")
    from jaxtrain.tools.loss_report import plot_figure

    base = write_log(tmp_path / "base" / "gpt2_1.log", range(1, 101), 100)
    test = write_log(tmp_path / "test" / "gpt2_1.log", range(41, 101), 100,
                     loss_of=lambda s: reference_loss(s) + (spike if s == 50 else 0))  # fmt: skip
    args = compare_loss.build_parser().parse_args([str(base), str(test)])
    results, _, _ = compare_loss.run_comparison(args)
    figure = plot_figure(results)
    figure.canvas.draw()
    diff_axes = figure.axes[1]
    threshold_lines = [line for line in diff_axes.get_lines() if line.get_label().startswith("threshold")
                       or (line.get_linestyle() == "--" and len(set(line.get_ydata())) == 1)]  # fmt: skip
    heights = sorted(float(line.get_ydata()[0]) for line in threshold_lines)
    assert heights == [-1e-5, 1e-5]
    to_pixels = diff_axes.transData.transform
    zero = to_pixels((50, 0))[1]
    assert all(abs(to_pixels((50, y))[1] - zero) >= 30 for y in heights)
    low, high = diff_axes.get_ylim()
    assert low < -1e-5 and high > max(1e-5, spike)  # the band and every difference are on the panel
