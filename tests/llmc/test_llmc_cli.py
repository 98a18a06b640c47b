"""`python -m llmc_io info|convert` on hand-built small files.

A handful of runs go through a real subprocess, as a user would start it (exit codes, stderr, no
traceback); the rest call the same main() in-process, since each interpreter start costs ~0.4 s here.
"""

import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_llmc_gpt2 import TINY, gpt2_header_bytes, tiny_file
from test_llmc_llama3 import model_tensors, write_infinitrain, write_llmc_branch

import llmc_io
from llmc_io.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def cli(*args):
    """A real `python -m llmc_io` process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "llmc_io", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )


@pytest.fixture
def run(capsys):
    """main() in-process, with the same (returncode, stdout, stderr) as cli()."""

    def run_main(*args):
        try:
            returncode = main([str(a) for a in args])
        except SystemExit as exit_:
            returncode = exit_.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, returncode, out, err)

    return run_main


def test_help_in_a_subprocess():
    result = cli("--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: python -m llmc_io")
    assert "info" in result.stdout and "convert" in result.stdout


@pytest.mark.parametrize("command", ["info", "convert"])
def test_help_of_each_command(run, command):
    result = run(command, "--help")
    assert result.returncode == 0 and result.stdout.startswith(f"usage: python -m llmc_io {command}")
    assert "--ffn-dim-multiplier" in result.stdout and "--verbose" in result.stdout
    if command == "convert":
        assert "--version {3,5}" in result.stdout


def test_info_on_a_gpt2_model(tmp_path):
    path, _ = tiny_file(tmp_path)
    result = cli("info", path)
    assert result.returncode == 0, result.stderr
    rows = dict(line.split(None, 1) for line in result.stdout.splitlines() if " " in line)
    assert rows["kind"] == "gpt2 model (magic 20240326)" and rows["layout"] == "llmc-gpt2"
    assert rows["version"] == "3 (float32)" and rows["padded_vocab_size"] == "16"
    assert rows["parameters"] == "1,920"  # 16*8 + 4*8 + 2*(12*64 + 13*8) + 2*8, by hand
    assert rows["size"] == "8,704 bytes (expected 8,704)"  # 1024 + 4*1920


def test_info_on_llama3_models_of_both_layouts(tmp_path, run):
    branch = write_llmc_branch(tmp_path / "branch.bin", model_tensors())
    result = run("info", branch, "--check")
    assert result.returncode == 0, result.stderr
    assert "llmc-llama3-branch" in result.stdout and "ffn_hidden_dim      28" in result.stdout
    assert "ffn_dim_multiplier  1.3\n" in result.stdout
    assert "tensors             all finite, biases zero" in result.stdout
    master = write_infinitrain(tmp_path / "master.bin", model_tensors(), float_slots=(1, 0, 500000))
    result = run("info", master, "--ffn-dim-multiplier", 1.3, "--norm-eps", 1e-5)
    assert result.returncode == 0, result.stderr
    assert "layout              infinitrain" in result.stdout and "truncated" in result.stdout


def test_info_on_a_text_file_names_every_magic_it_reads_and_how_to_tokenize_it(tmp_path, run):
    """llm.c's magics (train_gpt2.c, dev/data/data_common.py, llama3 branch) and InfiniTrain's
    LLaMA-3 tokenizer file, whose magic is LLaMA-3's shard magic (example/common/tokenizer.cc)."""
    text = tmp_path / "book.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 40)
    result = run("info", text)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    for magic in (20240326, 20240803, 20240520, 20240801, 20240328):
        assert str(magic) in result.stderr
    assert "20240328 (GPT-2 tokenizer file)" in result.stderr
    assert "python -m llmc_io shard FILE" in result.stderr


def test_info_on_a_gzipped_model_file_says_gzipped_with_the_gunzip_command(tmp_path, run):
    """A model file gzipped (gzip's 1f 8b magic, RFC 1952) as InfiniTrain's samples ship model.bin.gz."""
    packed = tmp_path / "model.bin.gz"
    packed.write_bytes(gzip.compress(Path(tiny_file(tmp_path)[0]).read_bytes()))
    result = run("info", packed)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "gzipped" in result.stderr and f"gunzip -k {packed}" in result.stderr
    assert "not an llm.c magic" not in result.stderr
    packed.parent.chmod(0o555)  # a read-only folder: gunzip could not unpack it in place
    try:
        result = run("info", packed)
    finally:
        packed.parent.chmod(0o755)
    assert f"read-only: unpack a copy elsewhere: gunzip -c {packed} > FILE" in result.stderr


def test_info_on_a_token_shard(tmp_path):
    path = tmp_path / "shard.bin"
    llmc_io.write_shard(path, [7, 50256, 3, 9], kind="gpt2")
    result = cli("info", path)
    assert result.returncode == 0, result.stderr
    assert "gpt2 token shard (magic 20240520)" in result.stdout
    assert "dtype        uint16" in result.stdout and "tokens       4" in result.stdout
    assert "token range  [3, 50256]" in result.stdout
    assert "size         1,032 bytes (expected 1,032)" in result.stdout


def test_convert_gpt2_same_version_is_byte_exact_in_a_subprocess(tmp_path):
    path, _ = tiny_file(tmp_path)
    result = cli("convert", path, tmp_path / "same.bin")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == (
        f"wrote {tmp_path / 'same.bin'}: gpt2, llmc-gpt2 layout, version 3 (float32), 8,704 bytes\n"
    )
    assert (tmp_path / "same.bin").read_bytes() == Path(path).read_bytes()


def test_convert_gpt2_bf16_round_trips(tmp_path, run):
    path, _ = tiny_file(tmp_path)
    result = run("convert", path, tmp_path / "bf16.bin", "--version", 5)
    assert result.returncode == 0 and "version 5 (bfloat16), 4,864 bytes" in result.stdout
    assert run("convert", tmp_path / "bf16.bin", tmp_path / "bf16b.bin").returncode == 0
    assert (tmp_path / "bf16b.bin").read_bytes() == (tmp_path / "bf16.bin").read_bytes()
    assert run("convert", tmp_path / "bf16.bin", tmp_path / "back.bin", "--version", 3).returncode == 0
    _, original = llmc_io.load_gpt2(path)
    _, back = llmc_io.load_gpt2(tmp_path / "back.bin")
    np.testing.assert_allclose(
        back["h"]["mlp"]["c_fc"]["kernel"], original["h"]["mlp"]["c_fc"]["kernel"], rtol=2**-8
    )


def test_convert_llama3_branch_and_truncated_files_to_infinitrain(tmp_path, run):
    t = model_tensors()
    branch = write_llmc_branch(tmp_path / "branch.bin", t)
    assert run("convert", branch, tmp_path / "out.bin").returncode == 0
    expected = write_infinitrain(tmp_path / "expected.bin", t, major_minor=(3, 2))
    assert (tmp_path / "out.bin").read_bytes() == Path(expected).read_bytes()
    # Repairing llm.c master's truncated floats gives the file InfiniTrain can read.
    master = write_infinitrain(tmp_path / "master.bin", t, float_slots=(1, 0, 500000), major_minor=(3, 2))
    assert (
        run(
            "convert", master, tmp_path / "fixed.bin", "--ffn-dim-multiplier", 1.3, "--norm-eps", 1e-5
        ).returncode
        == 0
    )
    assert (tmp_path / "fixed.bin").read_bytes() == Path(expected).read_bytes()
    # And converting an InfiniTrain file with the same version reproduces it.
    assert run("convert", expected, tmp_path / "again.bin").returncode == 0
    assert (tmp_path / "again.bin").read_bytes() == Path(expected).read_bytes()


def _one_line_error(result):
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    return lines[0]


def test_errors_are_one_line_with_exit_code_2_in_a_subprocess(tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(gpt2_header_bytes(4, **TINY))
    line = _one_line_error(cli("info", bad))
    assert (
        line == f"error: {bad}: header[1] version: expected 3 (fp32) or 5 (bf16), found 4; "
        "version 4 (mixed bf16) is no longer written or read by llm.c; re-export as version 3 or 5"
    )


def test_errors_of_each_kind(tmp_path, run):
    master = write_infinitrain(tmp_path / "master.bin", model_tensors(), float_slots=(1, 0, 500000))
    assert "truncated the floats" in _one_line_error(run("convert", master, tmp_path / "x.bin"))
    assert "InfiniTrain's layout holds fp32 only" in _one_line_error(
        run(
            "convert",
            write_llmc_branch(tmp_path / "b.bin", model_tensors()),
            tmp_path / "x.bin",
            "--version",
            5,
        )
    )
    assert "nothing at that path" in _one_line_error(run("info", tmp_path / "missing.bin"))
    shard = tmp_path / "shard.bin"
    llmc_io.write_shard(shard, [1, 2])
    assert "token shards need no conversion" in _one_line_error(run("convert", shard, tmp_path / "x.bin"))
    tokenizer = tmp_path / "tok.bin"
    tokenizer.write_bytes(np.array([20240328, 2, 50257, 50256] + [0] * 252, "<i4").tobytes())
    # info reads tokenizer files (test_llmc_tokenizer.py); a bare header is a truncated one.
    assert "header[2] token count" in _one_line_error(run("info", tokenizer))
    gpt2, _ = tiny_file(tmp_path)
    assert "overrides: expected none for a GPT-2 model file" in _one_line_error(
        run("info", gpt2, "--norm-eps", 1e-5)
    )
    assert not (tmp_path / "x.bin").exists()


def test_verbose_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\0" * 10)
    result = cli("info", bad, "--verbose")
    assert result.returncode != 0 and "Traceback" in result.stderr and "LLMCFormatError" in result.stderr


def test_usage_errors_exit_2(run):
    result = run("convert", "only-one-argument")
    assert result.returncode == 2 and "usage:" in result.stderr


def test_convert_replaces_an_existing_out_only_with_force(tmp_path, run):
    path, _ = tiny_file(tmp_path)
    out = tmp_path / "out.bin"
    out.write_bytes(b"a file the user keeps")
    line = _one_line_error(run("convert", path, out, "--version", 5))
    assert line == (
        f"error: {out}: OUT: expected a path that does not exist yet, found a file there; "
        "pass --force to replace it"
    )
    assert out.read_bytes() == b"a file the user keeps"
    assert run("convert", path, out, "--version", 5, "--force").returncode == 0
    assert llmc_io.model_info(out).version == 5


@pytest.mark.parametrize("alias", ["same", "symlink", "hardlink"])
def test_convert_never_writes_over_its_own_input(tmp_path, run, alias):
    path, _ = tiny_file(tmp_path)
    before = Path(path).read_bytes()
    out = {"same": Path(path), "symlink": tmp_path / "link.bin", "hardlink": tmp_path / "hard.bin"}[alias]
    if alias == "symlink":
        out.symlink_to(path)
    elif alias == "hardlink":
        out.hardlink_to(path)
    line = _one_line_error(run("convert", path, out, "--version", 5, "--force"))
    assert f"OUT: expected a file other than the input, found the input {path}" in line
    assert Path(path).read_bytes() == before


def test_convert_never_writes_over_an_hf_input_folder_or_a_committed_llmc_step(tmp_path, run):
    path, _ = tiny_file(tmp_path)
    assert run("convert", path, tmp_path / "hf", "--to", "hf").returncode == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    assert "expected a new or empty folder" in _one_line_error(
        run("convert", path, tmp_path / "hf", "--to", "hf")
    )
    for out, to in ((tmp_path / "hf", "hf"), (tmp_path / "hf" / "model.safetensors", "llmc")):
        line = _one_line_error(run("convert", tmp_path / "hf", out, "--to", to, "--force"))
        assert "expected a file other than the input" in line
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == before
    # Nor HF files into a checkpoint root: --init_from ROOT would take them for its newest step.
    (tmp_path / "ck" / "checkpoint_step_000005").mkdir(parents=True)
    line = _one_line_error(run("convert", path, tmp_path / "ck", "--to", "hf", "--force"))
    assert "found a checkpoint, a checkpoint root or an llm.c run folder" in line
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["checkpoint_step_000005"]
    # A file of a committed llm.c step is never replaced: -y 1 would resume the new file as that step.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "model_00000010.bin").write_bytes(Path(path).read_bytes())
    (run_dir / "DONE_00000010").touch()
    line = _one_line_error(run("convert", path, run_dir / "model_00000010.bin", "--version", 5, "--force"))
    assert "found a file of the committed llm.c step 10 (DONE_00000010 beside it)" in line
    assert (run_dir / "model_00000010.bin").read_bytes() == Path(path).read_bytes()
    # Nor a file inside a checkpoint step: an InfiniTrain PR step's model.bin is that step's weights.
    step = tmp_path / "it" / "checkpoint_step_000010"
    step.mkdir(parents=True)
    (step / "model.bin").write_bytes(Path(path).read_bytes())
    line = _one_line_error(run("convert", path, step / "model.bin", "--version", 5, "--force"))
    assert f"found a path inside the checkpoint step {step}" in line
    assert (step / "model.bin").read_bytes() == Path(path).read_bytes()


def test_convert_force_replaces_only_hf_files_llmc_io_wrote(tmp_path, run):
    path, _ = tiny_file(tmp_path)
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "config.json").write_text('{"model_type": "gpt2"}')  # as a model downloaded from the Hub
    (hub / "model.safetensors").write_bytes(b"their weights")
    line = _one_line_error(run("convert", path, hub, "--to", "hf", "--force"))
    assert "found config.json, model.safetensors of another program" in line
    assert (hub / "model.safetensors").read_bytes() == b"their weights"
    assert run("convert", path, tmp_path / "ours", "--to", "hf").returncode == 0
    assert run("convert", path, tmp_path / "ours", "--to", "hf", "--force").returncode == 0


def test_convert_to_hf_in_bfloat16_shards_read_by_the_safetensors_library(tmp_path, run):
    import json

    import ml_dtypes
    from safetensors.numpy import load_file

    path, _ = tiny_file(tmp_path)
    result = run(
        "convert", path, tmp_path / "hf", "--to", "hf", "--dtype", "bfloat16", "--max_shard_size", "2KB"
    )
    assert result.returncode == 0 and "as a Hugging Face folder (bfloat16)" in result.stdout, result.stderr
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all(name.endswith(f"-of-{len(shards):05d}.safetensors") for name in shards)
    tensors = {k: v for name in shards for k, v in load_file(str(tmp_path / "hf" / name)).items()}
    assert set(tensors) == set(index["weight_map"])
    _, params = llmc_io.load_gpt2(path)
    wte = params["wte"]["embedding"][: TINY["V"]]
    assert tensors["transformer.wte.weight"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(tensors["transformer.wte.weight"], wte.astype(ml_dtypes.bfloat16))
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())


def test_convert_takes_dtype_and_shard_size_with_to_hf_only(tmp_path, run):
    path, _ = tiny_file(tmp_path)
    line = _one_line_error(run("convert", path, tmp_path / "out.bin", "--dtype", "bfloat16"))
    assert "--dtype: expected given with --to hf only, found --to llmc" in line and "--version" in line
    line = _one_line_error(run("convert", path, tmp_path / "hf", "--to", "hf", "--max_shard_size", "lots"))
    assert "--max_shard_size: expected a size such as 5GB" in line and "'lots'" in line
    assert not (tmp_path / "out.bin").exists() and not (tmp_path / "hf").exists()
