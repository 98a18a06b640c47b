"""Read checkpoints from a shell: list, show, diff, verify, export (to llm.c, InfiniTrain or Hugging Face).

    python -m jaxtrain.ckpt ls CHECKPOINT_DIR
    python -m jaxtrain.ckpt show STEP_DIR [--tensors] [--all]
    python -m jaxtrain.ckpt diff STEP_DIR_A STEP_DIR_B
    python -m jaxtrain.ckpt verify STEP_DIR
    python -m jaxtrain.ckpt export STEP_DIR --output model.bin [--version 3|5] [--merge-lora [--base FILE]]
    python -m jaxtrain.ckpt export STEP_DIR --format hf --output HF_DIR [--tokenizer tokenizer.json] \\
        [--dtype float32|bfloat16|float16] [--max_shard_size 5GB] [--check]
    python -m jaxtrain.ckpt check-hf HF_DIR [--against CHECKPOINT] [--atol 0.05]
    python -m jaxtrain.ckpt export STEP_DIR --format llmc-run --output LLMC_RUN_DIR
    python -m jaxtrain.ckpt export STEP_DIR --format infinitrain --output OUT/checkpoint_step_NNNNNN \\
        [--ddp D] [--tp T] [--cp C] [--pp P] [--vpp V] [--zero_stage Z] [--sequence_parallel]

An llm.c run folder (train_gpt2cu -o DIR: model_%08d.bin, state_%08d_%05d.bin, DONE_%08d) is kind llmc:
ls takes the folder, show and verify DIR/model_%08d.bin or DIR (its newest committed step).
STEP_DIR is one `checkpoint_step_NNNNNN` directory: ours (Orbax) or InfiniTrain's (HEAD model.ckpt, PR
model.bin / model.pth, with or without rank_* subdirectories); every command says which kind it read,
and diff compares across kinds. A LoRA checkpoint (adapters only: its trainer state names the base
llm.c file) is shown, verified and diffed like any other and exported only merged into its base
(--merge-lora). Every command takes --json (for machines; a table for people otherwise) and --verbose
(a traceback with errors). No model is built and no accelerator is needed: JAX runs on the CPU unless
JAX_PLATFORMS says otherwise, and arrays are read as NumPy whatever number of devices saved them.

Exit status: 0 fine (diff: identical, i.e. every tensor bit-equal and the model config equal;
verify: no problem); 1 diff found a difference or verify found problems; 2 an error (no such path,
not a checkpoint, a root where a step directory is expected, a damaged item, a bad argument).
"""

import argparse
import os
import sys
import traceback

from jaxtrain.checkpoint.export_target import TARGETS
from jaxtrain.tools.command_line import program_name, reader_gone
from jaxtrain.tools.ckpt_commands import PROG, cmd_diff, cmd_export, cmd_ls, cmd_show, cmd_verify
from jaxtrain.tools.command_line import EXIT_ERROR
from jaxtrain.tools.hf_check import cmd_check_hf
from jaxtrain.config.flags import quiet_absl


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors in one line and exit status 2 like every other error."""

    def error(self, message):
        print(f'{self.prog}: error: {message} (see --help)', file=sys.stderr)
        raise SystemExit(EXIT_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=program_name(PROG), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument('--verbose', action='store_true', help='print a traceback with errors')
    # Also accepted after the command; SUPPRESS keeps the top-level value when it is not given there.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument('--json', action='store_true', help='machine-readable output (JSON on stdout)')
    common.add_argument(
        '--verbose', action='store_true', default=argparse.SUPPRESS, help='traceback with errors'
    )
    commands = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')

    ls = commands.add_parser(
        'ls',
        parents=[common],
        help='the checkpoints under a root',
        description='Every checkpoint step directory under a root: step, kind (orbax, infinitrain, '
        'infinitrain-bin, infinitrain-pth), committed or not (an Orbax temporary directory is a save that '
        'never finished), size, when written, whether it holds the optimizer state, the loss stored with '
        "it, and which one '--resume_from latest' would pick.",
    )
    ls.add_argument('dir', metavar='CHECKPOINT_DIR', help='the root (the run\'s --checkpoint_dir)')
    ls.set_defaults(run=cmd_ls)

    show = commands.add_parser(
        'show',
        parents=[common],
        help='the trainer state of one checkpoint (and its tensors)',
        description='The trainer state of one checkpoint: step, data position, model and training '
        'config, dtype, topology, versions, llm.c source. With --tensors, one row per tensor of params '
        'and opt_state: shape, dtype, sharding it was saved with, statistics, checksum (recomputed '
        'and compared with the recorded one).',
    )
    show.add_argument('step_dir', metavar='STEP_DIR', help='a checkpoint_step_NNNNNN directory')
    show.add_argument('--tensors', action='store_true', help='also read every tensor (slower)')
    show.add_argument(
        '--all', action='store_true', help='every training config key (default: those off their default)'
    )
    show.set_defaults(run=cmd_show)

    diff = commands.add_parser(
        'diff',
        parents=[common],
        help='compare two checkpoints',
        description='Configs field by field and every tensor (max abs and max relative difference). '
        'Exit 0 when identical: every tensor bit-equal on both sides and the model config equal; '
        'otherwise 1. Other config differences (paths, step) are listed but do not count.',
    )
    diff.add_argument('a', metavar='STEP_DIR_A')
    diff.add_argument('b', metavar='STEP_DIR_B')
    diff.set_defaults(run=cmd_diff)

    verify = commands.add_parser(
        'verify',
        parents=[common],
        help='check one checkpoint completely',
        description='Orbax: every item present (params, trainer_state; opt_state when has_optimizer_state), '
        'the JSON readable, every tensor checksum equal to the recorded one, and the params shaped as '
        'the model config implies. InfiniTrain: every file parses, names and shapes fit one model, every '
        'rank directory is there, Adam t equals the step, values finite, and the sha256 jaxtrain recorded '
        'match. Exit 0 when all is well, 1 with the list of problems otherwise.',
    )
    verify.add_argument('step_dir', metavar='STEP_DIR', help='a checkpoint_step_NNNNNN directory')
    verify.set_defaults(run=cmd_verify)

    export = commands.add_parser(
        'export',
        parents=[common],
        help='write the params as an llm.c model file or a Hugging Face folder, or the state as an '
        'InfiniTrain checkpoint',
        description='--format llmc (default): write the params as an llm.c file that --llmc_filepath reads: '
        'GPT-2 in llm.c\'s layout (head tied to wte; version 3 fp32 or 5 bf16), LLaMA-3 in InfiniTrain\'s '
        'layout (version 3 only); the params are verified against their checksums first. --format hf: a '
        'Hugging Face folder. --format infinitrain | infinitrain-bin: write --output (a '
        'checkpoint_step_NNNNNN directory) as InfiniTrain HEAD (model.ckpt, optimizer.ckpt) or PR (llm.c '
        'model.bin, optimizer.bin) files, from any kind.',
    )
    export.add_argument('step_dir', metavar='STEP_DIR', help='a checkpoint_step_NNNNNN directory')
    export.add_argument(
        '--output',
        required=True,
        metavar='PATH',
        help='the llm.c file (llmc), the folder (hf) or the step directory (infinitrain*) to write',
    )
    export.add_argument(
        '--format',
        choices=tuple(TARGETS),
        metavar='FORMAT',  # the help below names each choice; argparse's {a,b,...} overflows the usage
        default='llmc',
        help='llmc (default): an llm.c model file; hf: a Hugging Face folder, config.json, '
        'generation_config.json and model.safetensors or shards with their index (--dtype, '
        '--max_shard_size), for GPT2LMHeadModel / LlamaForCausalLM (GPT-2 head tied, a tied LLaMA tied); '
        'infinitrain / infinitrain-bin: an InfiniTrain step directory (HEAD / PR); infinitrain-lrs: '
        'HEAD\'s files with lr_scheduler.ckpt, for an InfiniTrain with PR 151\'s LR schedulers; llmc-run: '
        'model, state and DONE files of the step in the llm.c run folder --output, which train_gpt2cu -y 1 '
        'resumes (a --shuffle llmc run with AdamW state)',
    )
    export.add_argument(
        '--version',
        type=int,
        choices=(3, 5),
        default=None,
        help='the llm.c model file: 3 fp32, 5 bf16 (GPT-2 only). Default 3 for llmc; 5 for llmc-run, '
        "whose 3 is for train_gpt2cu built with PRECISION=FP32. Not with hf or infinitrain*",
    )
    export.add_argument(
        '--dtype',
        choices=('float32', 'bfloat16', 'float16'),
        default=None,
        help='--format hf: the dtype of the weight files (default float32; bfloat16 rounds to nearest even)',
    )
    export.add_argument(
        '--max_shard_size',
        metavar='SIZE',
        default=None,
        help='--format hf: the largest weight file before the next shard, as save_pretrained takes it '
        '(5GB = 5e9 bytes, 500MiB; default 50GB, as transformers 5); one model.safetensors when the '
        'weights fit',
    )
    export.add_argument(
        '--merge-lora',
        action='store_true',
        help="a LoRA checkpoint: fold W + (alpha/r)·B·A into its base model's weights and write those "
        '(a LoRA checkpoint cannot be exported otherwise)',
    )
    export.add_argument(
        '--base',
        metavar='FILE',
        default='',
        help="with --merge-lora: the base llm.c file, when it is no longer where trainer_state's llmc_file "
        'says (its sha256 must match)',
    )
    export.add_argument(
        '--force',
        action='store_true',
        help='replace what is at --output: a file, or a Hugging Face folder\'s config and weight '
        'files, a step directory or an llm.c run-folder step that an earlier export wrote. Never '
        'files another program or run wrote, a checkpoint\'s, or what the checkpoint started from',
    )
    export.add_argument(
        '--tokenizer',
        metavar='FILE',
        default='',
        help="--format hf: the tokenizer.json or tiktoken BPE file to write beside config.json (default: "
        "the run's --tokenizer, if it named one)",
    )
    topology = export.add_argument_group(
        'multi-GPU InfiniTrain layout (--format infinitrain)',
        'write one rank_NNNNNN/ per GPU, as an InfiniTrain run with these flags saves and --load reads',
    )
    for flag, upstream in (
        ('ddp', 'data-parallel ranks (upstream: --nthread_per_process / (tp x cp x pp))'),
        ('tp', '--tensor_parallel'),
        (
            'cp',
            "--context_parallel of the context-parallel branch (d03ba16): rank order TP-CP-DP-PP, "
            "cp_size in trainer_state.json",
        ),
        ('pp', '--pipeline_parallel'),
        ('vpp', '--virtual_pipeline_parallel (chunks per pipeline stage)'),
    ):
        topology.add_argument(f'--{flag}', type=int, default=1, metavar='N', help=f'{upstream}; default 1')
    topology.add_argument(
        '--zero_stage',
        type=int,
        default=0,
        choices=(0, 1, 2),
        help="upstream's --zero_stage: 1 or 2 shard Adam's state over the --ddp (x --cp) ranks; default 0 "
        '(3 is refused upstream)',
    )
    topology.add_argument(
        '--sequence_parallel', action='store_true', help="upstream's --sequence_parallel (sp_size = tp)"
    )
    export.add_argument(
        '--check',
        action='store_true',
        help='--format hf: then run check-hf on the folder against STEP_DIR (exit 1 above its --atol)',
    )
    export.set_defaults(run=cmd_export)

    check = commands.add_parser(
        'check-hf',
        parents=[common],
        help='compare a Hugging Face folder\'s logits with the jaxtrain model\'s',
        description='Runs two token sequences through the jaxtrain model (on --against\'s weights, or on the '
        'folder\'s as --init_from reads them) and through the folder: transformers\' model when it is '
        'installed, else a NumPy forward written from transformers\' modeling code. Prints the largest '
        'logit difference; exit 0 within --atol, 1 above it.',
    )
    check.add_argument('hf_dir', metavar='HF_DIR', help='a GPT2LMHeadModel / LlamaForCausalLM folder')
    check.add_argument(
        '--against',
        metavar='CHECKPOINT',
        default='',
        help="the weights jaxtrain runs: any step, root, llm.c file or folder --init_from reads "
        "(default: HF_DIR itself, which checks jaxtrain's reading of it)",
    )
    check.add_argument(
        '--atol',
        type=float,
        default=0.05,
        help='the largest logit difference that passes (0.05: a bfloat16 export of fp32 weights)',
    )
    check.set_defaults(run=cmd_check_hf)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)  # inside: --help's text goes to a pipe too
    except BrokenPipeError:
        return reader_gone()
    # Reading a checkpoint needs no accelerator: do not claim (or wait for) a GPU unless asked to.
    # JAX reads this when imported, which the commands do (through the registry) after this line.
    os.environ.setdefault('JAX_PLATFORMS', 'cpu')
    try:
        with quiet_absl(not args.verbose):
            return args.run(args)
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return 130
    except BrokenPipeError:  # `| head` has read what it wanted
        return reader_gone()
    except Exception as e:  # noqa: BLE001  one line for people, whatever failed; the traceback on request
        if args.verbose:
            traceback.print_exc()
        text = str(e).strip()
        message = text.splitlines()[0] if text else type(e).__name__
        from jaxtrain.checkpoint.layout import CheckpointError

        kind = '' if isinstance(e, CheckpointError) else f' ({type(e).__name__})'
        print(f'{program_name(PROG)} {args.command}: error: {message}{kind}', file=sys.stderr)
        return EXIT_ERROR


if __name__ == '__main__':
    sys.exit(main())
