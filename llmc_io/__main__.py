"""Command line: inspect and convert llm.c / InfiniTrain files.

    python -m llmc_io info FILE                 what a model file, token shard, tokenizer (llm.c's, a
                                                tokenizer.json or a tiktoken file) or HF folder holds
    python -m llmc_io convert IN OUT [--version 3|5] [--to llmc|hf [--dtype D] [--max_shard_size S]] [--force]
                                                IN: an llm.c file or an HF model folder
    python -m llmc_io shard INPUT... --family gpt2|llama3 --output PREFIX [--from text|ids|shard]
                                                [--tokenizer tokenizer.json|tokenizer.model] [--force]
    python -m llmc_io tokenizer TOKENIZER --family gpt2|llama3 --output FILE [--force]
                                                llm.c's tokenizer file from a BPE tokenizer
    python -m llmc_io gpt2-tokenizer encoder.json vocab.bpe --output tokenizer.json [--force]
                                                GPT-2's tokenizer.json from OpenAI's two files

Errors print one line on stderr and exit with status 2 (a traceback only with --verbose).
No command replaces what exists without --force, and none ever writes over its own input or a
file of a committed llm.c checkpoint step (output_file.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from llmc_io import header as hdr
from llmc_io import output_file
from llmc_io.text import make_shards
from llmc_io.text import tokenizer_files
from llmc_io.header import fp32_repr
from llmc_io.errors import LLMCFormatError
from llmc_io.gpt2 import GPT2Header, load_gpt2, save_gpt2
from llmc_io.hf import load_hf, save_hf
from llmc_io.hf.weights import DEFAULT_MAX_SHARD_SIZE, parse_size
from llmc_io.llama3 import LAYOUT_INFINITRAIN, load_llama3, save_llama3
from llmc_io.llama3_header import HF_ONLY_FIELDS
from llmc_io import model_info
from llmc_io.shards import read_shard, shard_info
from llmc_io.text.bpe import is_bpe_tokenizer_file
from llmc_io.text.tokenizer import GPT2_TOKENIZER_MAGIC, is_tokenizer_file, read_tokenizer

EXIT_ERROR = 2
_SHARD_MAGICS = (hdr.GPT2_SHARD_MAGIC, hdr.LLAMA3_SHARD_MAGIC)
_MODEL_MAGICS = (hdr.GPT2_MODEL_MAGIC, hdr.LLAMA3_MODEL_MAGIC)
# What `info` reads, by magic: LLaMA-3's token shards and InfiniTrain's LLaMA-3 tokenizer share one.
_INFO_MAGICS = ", ".join(
    [
        *(hdr.describe_magic(m) for m in (*_MODEL_MAGICS, hdr.GPT2_SHARD_MAGIC)),
        f"{hdr.LLAMA3_SHARD_MAGIC} (LLaMA-3 token shard or tokenizer file)",
        f"{GPT2_TOKENIZER_MAGIC} (GPT-2 tokenizer file)",
    ]
)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: otherwise the subcommand's default would reset `--verbose` given before the command.
    common.add_argument(
        "--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help="show a traceback on errors"
    )
    overrides = argparse.ArgumentParser(add_help=False)
    group = overrides.add_argument_group(
        "LLaMA-3 overrides",
        "values a LLaMA-3 file does not hold: the true floats of a file whose floats llm.c master's "
        "train_llama3.py truncated to integers, or max_gen_batch_size for the llm.c llama3-branch layout",
    )
    group.add_argument("--ffn-dim-multiplier", type=float, help="e.g. 1.4 (3.2-1B) or 1.3 (3.1-8B)")
    group.add_argument("--norm-eps", type=float, help="e.g. 1e-5")
    group.add_argument("--rope-theta", type=float, help="e.g. 500000 (recovered from the file if omitted)")
    group.add_argument("--max-gen-batch-size", type=int, help="default 4 for the llama3-branch layout")

    parser = argparse.ArgumentParser(
        # `jaxtrain llmc` runs this too (jaxtrain/cli.py puts that name in sys.argv[0])
        prog=sys.argv[0] if sys.argv and sys.argv[0].startswith("jaxtrain ") else "python -m llmc_io",
        parents=[common],
        description="Inspect and convert llm.c / InfiniTrain model files and token shards.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser(
        "info",
        parents=[common, overrides],
        help="show what a model file, token shard or tokenizer file holds",
        description="Print kind, layout, version, dtype, header fields, parameter count and sizes of a "
        "model file, the token count, dtype and token range of a token shard, or the token count and "
        "EOT of a tokenizer file.",
    )
    info.add_argument("file", metavar="FILE")
    info.add_argument(
        "--check",
        action="store_true",
        help="also read every tensor of a model file (finite values, zero biases)",
    )
    convert = commands.add_parser(
        "convert",
        parents=[common, overrides],
        help="rewrite a model file (fp32 <-> bf16, layouts)",
        description="Read a model file (or a Hugging Face GPT2LMHeadModel / LlamaForCausalLM folder) "
        "and write it again: GPT-2 as version 3 (fp32) or 5 (bf16); LLaMA-3 (either layout) as "
        "InfiniTrain's layout, version 3; or, with --to hf, as an HF folder. With the input's "
        "version, the output reproduces an input llmc_io would write byte for byte.",
    )
    convert.add_argument("input", metavar="IN")
    convert.add_argument("output", metavar="OUT")
    convert.add_argument(
        "--to",
        choices=("llmc", "hf"),
        default="llmc",
        help="llmc: an llm.c / InfiniTrain file (default); hf: an HF folder (config.json, "
        "generation_config.json and safetensors, sharded past --max_shard_size) that transformers "
        "loads as GPT2LMHeadModel / LlamaForCausalLM",
    )
    convert.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="with --to hf: the tensors' dtype (default float32); llm.c files take --version instead",
    )
    convert.add_argument(
        "--max_shard_size",
        help=f"with --to hf: the largest shard, e.g. 5GB or 500MB (default {DEFAULT_MAX_SHARD_SIZE}, "
        "as transformers' save_pretrained); past it the folder has shards and an index",
    )
    convert.add_argument(
        "--version",
        type=int,
        choices=(3, 5),
        help="3 = fp32, 5 = bf16 (GPT-2 only); default: the input's version",
    )
    convert.add_argument(
        "--force",
        action="store_true",
        help="replace an existing OUT (with --to hf: its config.json and model.safetensors); never IN "
        "itself or a file of a committed llm.c checkpoint step",
    )
    make_shards.add_parser(commands, [common])
    tokenizer_files.add_tokenizer_parser(commands, [common])
    tokenizer_files.add_gpt2_tokenizer_parser(commands, [common])
    return parser


def _overrides(args) -> dict:
    names = ("ffn_dim_multiplier", "norm_eps", "rope_theta", "max_gen_batch_size")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _print_rows(rows) -> None:
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _tokenizer_info(path) -> None:
    tokenizer = read_tokenizer(path)
    eot = tokenizer.tokens[tokenizer.eot_token]
    _print_rows(
        [
            ("file", path),
            ("kind", f"tokenizer (magic {hdr.describe_magic(tokenizer.magic)})"),
            ("version", tokenizer.version),
            ("tokens", f"{tokenizer.vocab_size:,}"),
            ("eot token", f"{tokenizer.eot_token} = {eot!r}"),
            ("longest token", f"{max(len(t) for t in tokenizer.tokens)} bytes"),
        ]
    )


def _bpe_info(path) -> None:
    from llmc_io.text.bpe import is_hf_tokenizer_json, load_text_tokenizer

    if is_hf_tokenizer_json(path):
        tokenizer = load_text_tokenizer(path, "gpt2")
        specials = sorted((i, t) for t, i in tokenizer.special_tokens.items())
        shown = ", ".join(f"{t} = {i}" for i, t in specials[:4]) + (", ..." if len(specials) > 4 else "")
        rows = [("kind", tokenizer.kind), ("tokens", f"{tokenizer.vocab_size:,} (max id + 1)")]
        rows.append(("special tokens", f"{len(specials)}: {shown}" if specials else "none"))
    else:
        gpt2, llama3 = (load_text_tokenizer(path, family) for family in ("gpt2", "llama3"))
        ranks = gpt2.vocab_size - 1
        rows = [
            ("kind", gpt2.kind),
            ("ranks", f"{ranks:,} (ids 0..{ranks - 1})"),
            ("--family gpt2", f"<|endoftext|> = {gpt2.eot_token}; {gpt2.vocab_size:,} tokens"),
            (
                "--family llama3",
                f"256 specials from {ranks} (<|begin_of_text|>); {llama3.vocab_size:,} tokens",
            ),
        ]
    _print_rows([("file", path), *rows])


def _hf_info(path) -> None:
    header, _ = load_hf(path)
    kind = "GPT2LMHeadModel" if isinstance(header, GPT2Header) else "LlamaForCausalLM"
    rows = [("file", path), ("kind", f"Hugging Face folder ({kind}), as llm.c would hold it")]
    rows += [(name, fp32_repr(v) if isinstance(v, float) else v) for name, v in vars(header).items()]
    _print_rows(rows + [("parameters", f"{header.num_parameters:,}")])


def _info(args) -> None:
    if os.path.isdir(args.file):  # only an HF folder is a directory: load_hf names what one lacks
        _hf_info(args.file)
        return
    if is_bpe_tokenizer_file(args.file):
        _bpe_info(args.file)
        return
    if is_tokenizer_file(args.file):
        _tokenizer_info(args.file)
        return
    magic = int(hdr.read_header(args.file)[0])
    if magic in _SHARD_MAGICS:
        info = shard_info(args.file)
        tokens = read_shard(args.file)
        _print_rows(
            [
                ("file", info.path),
                ("kind", f"{info.kind} token shard (magic {info.magic})"),
                ("version", info.version),
                ("dtype", info.dtype),
                ("tokens", f"{info.num_tokens:,}"),
                ("token range", f"[{int(tokens.min())}, {int(tokens.max())}]"),
                ("size", f"{info.actual_size:,} bytes (expected {info.expected_size:,})"),
            ]
        )
        return
    if magic not in _MODEL_MAGICS:
        raise LLMCFormatError(
            args.file,
            "header[0] magic",
            f"one of {_INFO_MAGICS}, or a tokenizer.json, a tiktoken BPE file or an HF folder",
            hdr.describe_magic(magic),
            "text becomes token shards with: python -m llmc_io shard FILE --family gpt2 --output PREFIX",
        )
    info = model_info(args.file, **_overrides(args))
    header = info.header
    rows = [
        ("file", info.path),
        ("kind", f"{info.kind} model (magic {magic})"),
        ("layout", info.layout),
        ("version", f"{info.version} ({info.dtype})"),
    ]
    rows += [
        (name, fp32_repr(value) if isinstance(value, float) else value)
        for name, value in vars(header).items()
        if name not in HF_ONLY_FIELDS  # a file holds none of them
    ]
    if info.kind == "llama3":
        major, minor = info.major_minor
        rows += [("ffn_hidden_dim", header.ffn_hidden_dim), ("major.minor", f"{major}.{minor}")]
    rows.append(("parameters", f"{header.num_parameters:,}"))
    if info.num_stored_values != header.num_parameters:
        rows.append(("stored values", f"{info.num_stored_values:,} (with zero biases)"))
    rows.append(("size", f"{info.actual_size:,} bytes (expected {info.expected_size:,})"))
    rows += [("note", note) for note in info.notes]
    if args.check:
        _load(info, args)
        rows.append(
            (
                "tensors",
                "all finite"
                + (", biases zero" if info.layout != LAYOUT_INFINITRAIN and info.kind == "llama3" else ""),
            )
        )
    _print_rows(rows)


def _load(info, args):
    if info.kind == "gpt2":
        return load_gpt2(info.path)
    return load_llama3(info.path, **_overrides(args))


def _save_llmc(output, header, params, version) -> None:
    if isinstance(header, GPT2Header):
        save_gpt2(output, header, params, version=version)
    elif version != 3:
        raise LLMCFormatError(
            output, "--version", "3 for a LLaMA-3 file", str(version), "InfiniTrain's layout holds fp32 only"
        )
    else:
        save_llama3(output, header, params)


def _convert_hf(args) -> None:
    """An HF folder in, or --to hf out."""
    if os.path.isdir(args.input):
        header, params = load_hf(args.input)
        kind = "gpt2" if isinstance(header, GPT2Header) else "llama3"
    else:
        info = model_info(args.input, **_overrides(args))
        header, params = _load(info, args)
        kind = info.kind
    if args.to == "hf":
        dtype = args.dtype or "float32"
        written = save_hf(args.output, header, params, dtype, args.max_shard_size or DEFAULT_MAX_SHARD_SIZE)
        print(f"wrote {', '.join(written)}: {kind} as a Hugging Face folder ({dtype})")
        return
    version = args.version or 3
    _save_llmc(args.output, header, params, version)
    out = model_info(args.output)
    print(
        f"wrote {args.output}: {kind} from the HF folder {args.input}, version {version} ({out.dtype}), "
        f"{out.actual_size:,} bytes"
    )


def _check_convert_output(args) -> None:
    inputs = [args.input]
    if os.path.isdir(args.input):  # an HF folder: its files are the input too
        inputs += [os.path.join(args.input, name) for name in os.listdir(args.input)]
    if args.to == "hf":
        output_file.check_new_folder(args.output, args.force, inputs)
    else:
        output_file.check_new_file(args.output, args.force, inputs)


def _convert(args) -> None:
    for flag in ("dtype", "max_shard_size"):
        if getattr(args, flag) is not None and args.to != "hf":
            raise LLMCFormatError(
                args.output,
                f"--{flag}",
                "given with --to hf only",
                f"--to {args.to}",
                "llm.c files take --version 3 (fp32) or 5 (bf16)",
            )
    if args.max_shard_size is not None:  # a malformed size is refused before anything is read
        try:
            parse_size(args.max_shard_size)
        except ValueError:
            raise LLMCFormatError(
                args.output,
                "--max_shard_size",
                "a size such as 5GB, 500MB or 2GiB",
                repr(args.max_shard_size),
            ) from None
    _check_convert_output(args)
    if os.path.isdir(args.input) or args.to == "hf":
        _convert_hf(args)
        return
    magic = int(hdr.read_header(args.input)[0])
    if magic in _SHARD_MAGICS:
        raise LLMCFormatError(
            args.input,
            "header[0] magic",
            "a model file",
            hdr.describe_magic(magic),
            "token shards need no conversion",
        )
    info = model_info(args.input, **_overrides(args))
    if info.kind == "gpt2":
        version = args.version or info.version
        layout = info.layout
    else:
        version = args.version or 3
        layout = LAYOUT_INFINITRAIN
        if version != 3:
            raise LLMCFormatError(
                args.output,
                "--version",
                "3 for a LLaMA-3 file",
                str(version),
                "InfiniTrain's layout holds fp32 only",
            )
    header, params = _load(info, args)
    if info.kind == "gpt2":
        save_gpt2(args.output, header, params, version=version)
    else:
        # Slots 14/15 pass through, so converting an InfiniTrain file reproduces it exactly.
        save_llama3(args.output, header, params, major_minor=info.major_minor)
    out = model_info(args.output)
    print(
        f"wrote {args.output}: {info.kind}, {layout} layout, version {version} ({out.dtype}), "
        f"{out.actual_size:,} bytes"
    )


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)  # inside: --help's text goes to a pipe too
        commands = {
            "info": _info,
            "convert": _convert,
            "shard": make_shards.run,
            "tokenizer": tokenizer_files.run_tokenizer,
            "gpt2-tokenizer": tokenizer_files.run_gpt2_tokenizer,
        }
        commands[args.command](args)
    except BrokenPipeError:  # `| head` has read what it wanted: no error, nothing on stderr
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush would raise again
        return 128 + signal.SIGPIPE
    except (LLMCFormatError, OSError) as error:
        if getattr(args, "verbose", False):
            raise
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
