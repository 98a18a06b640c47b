"""InfiniTrain's trainer_state.json, both generations: a tolerant reader and a strict, valid-JSON writer.

HEAD (InfiniTensor/InfiniTrain b24d92f, infini_train/src/checkpoint/checkpoint.cc SaveTrainerState) writes
    n_layer, n_head, n_kv_head, n_embd, vocab_size, global_step, consumed_batches, last_lr, ddp/tp/sp/pp_size
with NO comma after vocab_size, so the file is not JSON; upstream reads it back with a hand-rolled extractor
(first `"key"`, then the text after ':' up to ',' / newline / '}'). The shape fields are GPT2Config() /
LLaMA3Config() defaults when the model came from --llmc_filepath (main.cc never updates model_config), and
its resume CHECKs them against the same defaults.
The LR-scheduler generation (PR 151, a7949ac0; not in master at b24d92f) writes HEAD's keys
without last_lr, as valid JSON: the learning rate lives in lr_scheduler.ckpt (lr_scheduler.py).
PR generation (f9cb65b5, infini_train/src/checkpoint.cc) writes valid JSON:
    global_step, data_batch_idx, data_batch_stride, best_loss, last_lr, optimizer_type, checkpoint_format,
    ddp/tp/sp/pp_size
(best_loss prints `inf` before the first step, which is not JSON either).

Our writer puts upstream's keys first, one per line in upstream's order and number formatting (C++ ostream
%g), so upstream's extractor reads them; then a "jaxtrain" object with what only jaxtrain needs. Non-finite
best_loss is written as null, which upstream's extractor fails to parse and so replaces by its +inf default.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re

from llmc_io.atomic_file import write_bytes_atomically
from llmc_io.errors import LLMCFormatError

HEAD = "head"
PR = "pr"
LR_SCHEDULER = "lrs"  # HEAD's layout less last_lr (PR 151)

HEAD_KEYS = (
    "n_layer",
    "n_head",
    "n_kv_head",
    "n_embd",
    "vocab_size",
    "global_step",
    "consumed_batches",
    "last_lr",
    "ddp_size",
    "tp_size",
    "sp_size",
    "pp_size",
)
PR_KEYS = (
    "global_step",
    "data_batch_idx",
    "data_batch_stride",
    "best_loss",
    "last_lr",
    "optimizer_type",
    "checkpoint_format",
    "ddp_size",
    "tp_size",
    "sp_size",
    "pp_size",
)

# The shape fields HEAD's main.cc writes and CHECKs for a model loaded from an llm.c file
# (example/gpt2/config.h GPT2Config(), example/llama3/config.h LLaMA3Config(), b24d92f).
CONFIG_DEFAULTS = {
    "gpt2": {"n_layer": 12, "n_head": 12, "n_kv_head": 12, "n_embd": 768, "vocab_size": 50304},
    "llama3": {"n_layer": 16, "n_head": 32, "n_kv_head": 8, "n_embd": 2048, "vocab_size": 128256},
}


@dataclasses.dataclass
class InfiniTrainState:
    generation: str  # HEAD, LR_SCHEDULER or PR
    global_step: int
    data_batch_idx: int  # HEAD consumed_batches / PR data_batch_idx: the next DataLoader batch index
    last_lr: float | None  # None in the LR_SCHEDULER generation, which has no such field
    data_batch_stride: int = 1  # PR; HEAD's stride is ddp_size
    best_loss: float | None = None  # PR only
    optimizer_type: str | None = None  # PR only ("SGD", "Adam")
    checkpoint_format: str | None = None  # PR only ("bin", "pth")
    shape: dict = dataclasses.field(default_factory=dict)  # HEAD's n_layer..vocab_size as written
    ddp_size: int = 1
    tp_size: int = 1
    sp_size: int = 1
    pp_size: int = 1
    # context parallel (upstream PR 181, feat/context_parallel d03ba16): None when the file has no such key
    cp_size: int | None = None
    jaxtrain: dict | None = None  # our own section, when jaxtrain wrote the file
    notices: list = dataclasses.field(default_factory=list)  # one line each, for the log


_MISSING_COMMA = re.compile(r'("[A-Za-z_]+"\s*:\s*[^,\s{}\[\]]+)(\s*\n\s*")')
_BARE_NONFINITE = re.compile(r':\s*(-?)(inf|nan)\b')


def _parse(path: str, text: str) -> tuple[dict, list[str]]:
    notices = []
    try:
        return json.loads(text), notices
    except json.JSONDecodeError as first_error:
        repaired = _BARE_NONFINITE.sub(
            lambda m: ": " + ("-Infinity" if m.group(1) else "Infinity") if m.group(2) == "inf" else ": NaN",
            text,
        )
        missing = [m.group(1).split(":")[0].strip() for m in _MISSING_COMMA.finditer(repaired)]
        repaired = _MISSING_COMMA.sub(r"\1,\2", repaired)
        try:
            data = json.loads(repaired)
        except json.JSONDecodeError:
            raise LLMCFormatError(
                path,
                "JSON",
                "a JSON object (HEAD's missing comma tolerated)",
                f"unparseable text at line {first_error.lineno} column {first_error.colno}",
            ) from None
        if missing:
            notices.append(
                f"{path}: not valid JSON (no comma after {', '.join(missing)}), as InfiniTrain HEAD "
                "writes it; read field by field like upstream's extractor"
            )
        if repaired != text and not missing:
            notices.append(f"{path}: non-JSON number (inf/nan) read as upstream does")
        return data, notices


def _number(path, data, key, kind, default=None):
    if key not in data:
        if default is not None:
            return default
        raise LLMCFormatError(
            path,
            key,
            f"a {kind.__name__} field",
            "missing",
            "not an InfiniTrain trainer_state.json, or a truncated one",
        )
    value = data[key]
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise LLMCFormatError(path, key, "an integer", repr(value))
        return value
    if value is None:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LLMCFormatError(path, key, "a number", repr(value))
    return float(value)


def read_trainer_state(path: str | os.PathLike) -> InfiniTrainState:
    """Either generation's trainer_state.json (or ours, which has upstream's keys plus "jaxtrain")."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise LLMCFormatError(
            path,
            "trainer_state.json",
            "a file",
            "nothing there",
            "an InfiniTrain step directory holds model + trainer_state.json",
        )
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise LLMCFormatError(path, "encoding", "UTF-8 text", "binary data") from None
    data, notices = _parse(path, text)
    if not isinstance(data, dict):
        raise LLMCFormatError(path, "top level", "a JSON object", type(data).__name__)
    if "consumed_batches" in data:
        generation, batch_key = (HEAD if "last_lr" in data else LR_SCHEDULER), "consumed_batches"
    elif "data_batch_idx" in data:
        generation, batch_key = PR, "data_batch_idx"
    else:
        raise LLMCFormatError(
            path,
            "consumed_batches / data_batch_idx",
            "one of them (HEAD / PR generation)",
            "neither",
            "not an InfiniTrain trainer_state.json",
        )
    state = InfiniTrainState(
        generation=generation,
        global_step=_number(path, data, "global_step", int),
        data_batch_idx=_number(path, data, batch_key, int),
        last_lr=None if generation == LR_SCHEDULER else _number(path, data, "last_lr", float),
        ddp_size=_number(path, data, "ddp_size", int, 1),
        tp_size=_number(path, data, "tp_size", int, 1),
        sp_size=_number(path, data, "sp_size", int, 1),
        pp_size=_number(path, data, "pp_size", int, 1),
        cp_size=_number(path, data, "cp_size", int) if "cp_size" in data else None,
        notices=notices,
    )
    if generation in (HEAD, LR_SCHEDULER):
        state.data_batch_stride = state.ddp_size
        state.shape = {k: _number(path, data, k, int) for k in HEAD_KEYS[:5] if k in data}
    else:
        state.data_batch_stride = _number(path, data, "data_batch_stride", int, 1)
        state.best_loss = _number(path, data, "best_loss", float, math.inf)
        for key in ("optimizer_type", "checkpoint_format"):
            value = data.get(key)
            if value is not None and not isinstance(value, str):
                raise LLMCFormatError(path, key, "a string", repr(value))
            setattr(state, key, value)
    for key in ("global_step", "data_batch_idx"):
        if getattr(state, key) < 0:
            raise LLMCFormatError(
                path, key if key == "global_step" else batch_key, ">= 0", getattr(state, key)
            )
    extras = data.get("jaxtrain")
    if extras is not None and not isinstance(extras, dict):
        raise LLMCFormatError(path, "jaxtrain", "an object", type(extras).__name__)
    state.jaxtrain = extras
    return state


def _cpp_number(value) -> str:
    """What `std::ostream << value` prints: ints as is, doubles/floats as %g (precision 6)."""
    if isinstance(value, bool):
        raise TypeError("bool is not a trainer_state number")
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return "null"  # valid JSON; upstream's extractor fails on it and keeps its +inf default
    return f"{value:g}"


def render_trainer_state(state: InfiniTrainState) -> str:
    """The file text: upstream's keys in upstream's order and number format, all commas, then "jaxtrain"."""
    if state.generation in (HEAD, LR_SCHEDULER):
        fields = dict(state.shape)
        missing = [k for k in HEAD_KEYS[:5] if k not in fields]
        if missing:
            raise ValueError(f"HEAD trainer_state needs the shape fields {missing}")
        fields.update(global_step=state.global_step, consumed_batches=state.data_batch_idx)
        keys = HEAD_KEYS
        if state.generation == HEAD:
            fields.update(last_lr=float(state.last_lr))
        else:
            keys = tuple(k for k in HEAD_KEYS if k != "last_lr")
    else:
        fields = dict(
            global_step=state.global_step,
            data_batch_idx=state.data_batch_idx,
            data_batch_stride=state.data_batch_stride,
            best_loss=math.inf if state.best_loss is None else float(state.best_loss),
            last_lr=float(state.last_lr),
            optimizer_type=state.optimizer_type or "unknown",
            checkpoint_format=state.checkpoint_format or "bin",
        )
        keys = PR_KEYS
    fields.update(
        ddp_size=state.ddp_size, tp_size=state.tp_size, sp_size=state.sp_size, pp_size=state.pp_size
    )
    if state.cp_size is not None:  # d03ba16 checkpoint.cc:196: cp_size between sp and pp
        fields["cp_size"] = state.cp_size
        keys = tuple(k for key in keys for k in (("cp_size", key) if key == "pp_size" else (key,)))
    lines = []
    for key in keys:
        value = fields[key]
        text = json.dumps(value) if isinstance(value, str) else _cpp_number(value)
        lines.append(f'  "{key}": {text}')
    if state.jaxtrain is not None:
        # One line, after every upstream key, so upstream's first-match extractor never lands inside it.
        lines.append('  "jaxtrain": ' + json.dumps(state.jaxtrain, sort_keys=True, allow_nan=False))
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_trainer_state(path: str | os.PathLike, state: InfiniTrainState) -> None:
    """Write trainer_state.json atomically (temporary name, then rename)."""
    text = render_trainer_state(state)
    json.loads(text)  # the writer's promise: valid JSON, always
    write_bytes_atomically(path, text.encode("utf-8"))
