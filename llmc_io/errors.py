"""The one exception type of llmc_io.

Every problem with a file is reported on one line that a person can act on:

    PATH: FIELD: expected X, found Y; what to do

so that the CLI can print it without a traceback and the trainer can pass it through unchanged.
"""

from __future__ import annotations

import os


class LLMCFormatError(ValueError):
    """A file (or a parameter tree about to be written) does not match its llm.c format.

    The attributes mirror the parts of the message, so callers and tests need not parse it.
    """

    def __init__(
        self, path: str | os.PathLike, field: str, expected: object, found: object, hint: str | None = None
    ):
        self.path = os.fspath(path)
        self.field = field
        self.expected = expected
        self.found = found
        self.hint = hint
        message = f"{self.path}: {field}: expected {expected}, found {found}"
        if hint:
            message += f"; {hint}"
        # The CLI prints this as its single line of output.
        super().__init__(message.replace("\n", " "))

    def __reduce__(self):
        # Default pickling calls cls(message) and fails; multiprocessing workers need this.
        return (type(self), (self.path, self.field, self.expected, self.found, self.hint))
