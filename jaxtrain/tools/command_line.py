"""What the tools share as commands: the name they give themselves in usage and error lines, and
a quiet end when the reader of their output goes away.

The name is how the tool was started: `jaxtrain ckpt` through the jaxtrain command (cli.py puts
that in sys.argv[0]) or `python -m jaxtrain.ckpt`. A reader that closes the pipe early (`| head`)
has all it wanted, so that is no error: the tool stops with 128 + SIGPIPE, as C tools do, and
prints nothing on stderr.
"""

import os
import signal
import sys

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2  # findings: diff saw a difference, verify a problem
EXIT_READER_GONE = 128 + signal.SIGPIPE


def program_name(module_form: str) -> str:
    """`jaxtrain COMMAND` when started through the jaxtrain command, else `module_form`."""
    return sys.argv[0] if sys.argv and sys.argv[0].startswith('jaxtrain ') else module_form


def reader_gone() -> int:
    """Call on BrokenPipeError from stdout: points stdout at /dev/null, so that the interpreter's
    last flush at exit does not raise again, and returns the exit status."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_READER_GONE
