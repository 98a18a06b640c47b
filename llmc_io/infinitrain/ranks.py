"""A multi-GPU InfiniTrain step directory (`rank_NNNNNN/` per global rank) <-> one single-rank view.

Reading puts the ranks' model and Adam files back into the StateDicts a one-GPU run of the same model
would write (TP = PP = 1 names; Adam keyed by parameter name), which llmc_io/infinitrain/names.py turns
into our trees; llmc_io/infinitrain/rank_writer.py does the reverse for a named topology. The rules
(rank numbering, `module.` prefix, stages, slices, ZeRO pieces) are in llmc_io/infinitrain/topology.py
with upstream's file and line; this module checks that the directories
agree and moves the tensors.

Only HEAD's files (b24d92f: model.ckpt, optimizer.ckpt with positional `adam.m.{i}`) are handled, and those
of the context-parallel branch built on it (d03ba16: a CP axis in the rank order, cp_size in
trainer_state.json; llmc_io/infinitrain/topology.py has its rules): a multi-GPU run of the PR generation
was never sampled, and its name-keyed Adam file under `module.` has no upstream test to check against.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

from llmc_io.infinitrain import layout
from llmc_io.infinitrain import topology as topo
from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.state import InfiniTrainState, read_trainer_state
from llmc_io.infinitrain.statedict import KFLOAT32, KINT64, CkptTensor, read_state_dict

MODEL_FILE, OPTIMIZER_FILE, TRAINER_STATE = "model.ckpt", "optimizer.ckpt", "trainer_state.json"
_RANK_NAME = re.compile(r"^rank_(\d+)$")
_ADAM_KEY = re.compile(r"^adam\.([mv])\.(\d+)$")


@dataclasses.dataclass
class MergedStep:
    model: dict  # global StateDict name -> CkptTensor
    optimizer: dict | None  # 'adam.m.<global name>', 'adam.v.<global name>', 'adam.t' -> CkptTensor
    state: InfiniTrainState  # rank 0's trainer state
    topology: topo.Topology
    notices: list


def _duplicates(step_dir: Path) -> None:
    by_rank: dict[int, list[str]] = {}
    for p in step_dir.iterdir():
        if p.is_dir() and (m := _RANK_NAME.match(p.name)):
            by_rank.setdefault(int(m.group(1)), []).append(p.name)
    for rank, names in sorted(by_rank.items()):
        if len(names) > 1:
            raise LLMCFormatError(
                step_dir,
                f"rank {rank}",
                "one directory",
                f"{len(names)} ({', '.join(sorted(names))})",
                "keep the rank_{:06d} one and remove the others",
            )


def _topology_of(path: Path, state: InfiniTrainState, vpp: int, zero_stage: int) -> topo.Topology:
    tp = state.tp_size
    if state.sp_size not in (1, tp):
        raise LLMCFormatError(
            path,
            "sp_size",
            f"1 or tp_size {tp} (example/gpt2/main.cc:152)",
            str(state.sp_size),
            "the file was not written by InfiniTrain",
        )
    return topo.Topology(
        ddp=state.ddp_size,
        tp=tp,
        pp=state.pp_size,
        vpp=vpp,
        sequence_parallel=state.sp_size == tp and tp > 1,
        zero_stage=zero_stage,
        cp=state.cp_size or 1,  # no cp_size (b24d92f): no context parallelism
    )


def _check_agree(ranks: list[Path], states: list[InfiniTrainState]) -> None:
    first = states[0]
    for path, state in zip(ranks[1:], states[1:], strict=True):
        for field in ("global_step", "ddp_size", "tp_size", "sp_size", "cp_size", "pp_size"):
            if getattr(state, field) != getattr(first, field):
                raise LLMCFormatError(
                    path / TRAINER_STATE,
                    field,
                    f"{getattr(first, field)} (as rank_000000)",
                    str(getattr(state, field)),
                    "the rank directories are from different saves; copy one step's",
                )


def _layer_count(tensors: dict) -> int:
    layers = {int(n.split(".")[3 if n.startswith(topo.PREFIX) else 2]) for n in tensors if ".h." in n}
    return max(layers) + 1 if layers else 0


def _pick_vpp(step_dir, counts: list[int], pp: int, vpp: int | None, notices: list, hint=None) -> int:
    """The run's --virtual_pipeline_parallel: `vpp` if given (it must fit), else the one chunk count whose
    stages hold `counts` layers; where several fit, `hint` (the resuming run's own, same pp) or 1."""
    total = sum(counts)
    fits = [
        v
        for v in range(1, max(total // pp, 1) + 1)
        if [len(topo.stage_layers(total, pp, s, v)) for s in range(pp)] == counts
        and all(len(topo.chunk_ranges(total, pp, s, v)) == v for s in range(pp))
    ]
    if vpp is not None:
        if vpp not in fits:
            raise LLMCFormatError(
                step_dir,
                "virtual pipeline chunks",
                f"a --vpp whose stages hold {counts} layers",
                f"--vpp {vpp}",
                f"these stages fit --vpp {' or '.join(map(str, fits)) or 'nothing'}",
            )
        return vpp
    if not fits:
        raise LLMCFormatError(
            step_dir,
            "layers per pipeline stage",
            "what PipelineParallel::GetStageInfo gives some --vpp",
            str(counts),
            "a stage's files are missing or from another run",
        )
    if hint in fits and len(fits) > 1:
        notices.append(
            f"{step_dir}: its stages fit --virtual_pipeline_parallel {fits}; {hint} is taken from this run's"
        )
        return hint
    if 1 in fits:
        if len(fits) > 1:
            notices.append(
                f"{step_dir}: trainer_state.json does not record --virtual_pipeline_parallel; its stages fit "
                f"{fits}, so 1 (upstream's default) is assumed"
            )
        return 1
    if len(fits) > 1:
        raise LLMCFormatError(
            step_dir,
            "virtual pipeline chunks",
            "one --vpp that fits the stages",
            f"{fits}",
            "trainer_state.json does not record it; pass the run's --virtual_pipeline_parallel",
        )
    return fits[0]


def read_step(
    step_dir, ranks: list[Path], vpp: int | None = None, run_pipeline: tuple[int, int] | None = None
) -> MergedStep:
    """Every rank of a HEAD step directory -> the single-rank StateDicts (checked to add up).
    vpp: the saved run's --virtual_pipeline_parallel, when known; run_pipeline: (pp, vpp) of the run
    that resumes, which an InfiniTrain user starts with the saved run's flags."""
    step_dir = Path(step_dir)
    _duplicates(step_dir)
    notices: list = []
    for r in ranks:
        for name in (MODEL_FILE, TRAINER_STATE):
            if not (r / name).is_file():
                raise LLMCFormatError(
                    r / name, "file", "present", "missing", "copy every rank's files of the step"
                )
    states = [read_trainer_state(r / TRAINER_STATE) for r in ranks]
    _check_agree(ranks, states)
    state = states[0]
    recorded = state.jaxtrain or {}
    if vpp is None and recorded.get("virtual_pipeline_parallel"):
        vpp = int(recorded["virtual_pipeline_parallel"])
    if state.cp_size is not None and state.cp_size < 1:
        raise LLMCFormatError(ranks[0] / TRAINER_STATE, "cp_size", "1 or more", str(state.cp_size))
    shape = _topology_of(ranks[0] / TRAINER_STATE, state, 1, 0)
    if shape.world != len(ranks):
        cp, sizes = (" x cp", f" x {shape.cp}") if shape.cp > 1 else ("", "")
        raise LLMCFormatError(
            step_dir,
            "rank directories",
            f"ddp x tp{cp} x pp = {shape.ddp} x {shape.tp}{sizes} x {shape.pp} = {shape.world} "
            "(trainer_state.json)",
            str(len(ranks)),
            "copy the whole step directory of every rank",
        )
    # the weights of one replica: DP and CP ranks hold the same (llmc_io/infinitrain/topology.py)
    models = {
        i: read_state_dict(r / MODEL_FILE)
        for i, r in enumerate(ranks)
        if shape.coords(i)[0] == 0 and shape.cp_of(i) == 0
    }
    counts = [_layer_count(models[shape.rank_of(0, 0, s)]) for s in range(shape.pp)]
    hint = run_pipeline[1] if run_pipeline and run_pipeline[0] == shape.pp else None
    vpp = _pick_vpp(step_dir, counts, shape.pp, vpp, notices, hint)
    num_layers = sum(counts)
    has_opt = [(r / OPTIMIZER_FILE).is_file() for r in ranks]
    if any(has_opt) and not all(has_opt):
        missing = ranks[has_opt.index(False)] / OPTIMIZER_FILE
        raise LLMCFormatError(
            missing,
            "file",
            "present (other ranks have one)",
            "missing",
            "copy every rank's files of the step",
        )
    optimizers = (
        {i: read_state_dict(r / OPTIMIZER_FILE) for i, r in enumerate(ranks)} if all(has_opt) else None
    )
    zero_stage = 0
    if optimizers is not None and shape.replicas > 1 and _looks_sharded(optimizers[0], models[0]):
        zero_stage = 1  # ZeRO-1 and -2 shard the optimizer alike; the files cannot tell them apart
    topology = dataclasses.replace(_topology_of(ranks[0] / TRAINER_STATE, state, vpp, zero_stage))
    model = _merge_model(ranks, models, topology, num_layers, notices)
    optimizer = None
    if optimizers is not None:
        optimizer = _merge_optimizer(ranks, models, optimizers, topology, num_layers, model, notices)
    if shape.replicas > 1:
        group = f"data-parallel rank 0 of {shape.ddp}" + (
            f", context-parallel rank 0 of {shape.cp}" if shape.cp > 1 else ""
        )
        notices.append(f"{step_dir}: weights read from {group} (replicas)")
    notices.append(f"{step_dir}: {len(ranks)} rank directories, {topology.describe()}")
    return MergedStep(model, optimizer, state, topology, notices)


def replica_differences(ranks: list[Path], topology: topo.Topology) -> list[str]:
    """Data-parallel replicas must hold the same weights (DDP averages the gradients every step, over
    DP x CP with context parallelism): one line per tensor of a DDP or CP rank > 0 that differs from DDP
    rank 0's (CP rank 0's) of the same TP rank and stage."""
    problems = []
    for rank, path in enumerate(ranks):
        dp, tp, stage = topology.coords(rank)
        if dp == 0 and topology.cp_of(rank) == 0:
            continue
        lead = read_state_dict(ranks[topology.rank_of(0, tp, stage)] / MODEL_FILE)
        for name, tensor in read_state_dict(path / MODEL_FILE).items():
            other = lead.get(name)
            if other is None or other.array.tobytes() != tensor.array.tobytes():
                problems.append(
                    f"{path / MODEL_FILE}: tensor '{name}': expected the bytes of data-parallel rank 0 "
                    f"({ranks[topology.rank_of(0, tp, stage)].name}), found "
                    + ("no such tensor there" if other is None else "different values")
                )
    return problems


def _looks_sharded(optimizer: dict, model: dict) -> bool:
    """ZeRO pieces are 1-D; without ZeRO adam.m.{i} has its parameter's shape, 2-D for every weight."""
    return all(t.array.ndim <= 1 for k, t in optimizer.items() if _ADAM_KEY.match(k)) and any(
        t.array.ndim == 2 for t in model.values()
    )


def _merge_model(ranks, models, topology, num_layers, notices) -> dict:
    parts: dict[str, dict[int, np.ndarray]] = {}
    dtypes: dict[str, int] = {}
    for rank, tensors in models.items():
        _, tp, stage = topology.coords(rank)
        for local, tensor in tensors.items():
            name = topo.global_name(local, stage, topology, num_layers)
            if name is None:
                raise LLMCFormatError(
                    ranks[rank] / MODEL_FILE,
                    f"tensor '{local}'",
                    f"a name of pipeline stage {stage} of {topology.pp} ({num_layers} layers"
                    f"{', module. prefix' if topology.prefixed else ''})",
                    "a name that does not fit it",
                    "the rank directories are from different runs",
                )
            parts.setdefault(name, {})[tp] = tensor.array
            dtypes[name] = tensor.dtype
    n_embd = topo.n_embd_of({n: p[0] for n, p in parts.items()})
    model = {}
    for name, by_tp in parts.items():
        if sorted(by_tp) != list(range(topology.tp)):
            missing = min(set(range(topology.tp)) - set(by_tp))
            raise LLMCFormatError(
                ranks[0].parent,
                f"tensor '{name}'",
                "on every TP rank of its stage",
                f"not on TP rank {missing}",
                "a rank's model file is incomplete",
            )
        value = topo.tp_merge(ranks[0].parent, name, [by_tp[t] for t in range(topology.tp)], n_embd)
        model[name] = CkptTensor(dtypes[name], value)
    if "transformer.wpe.weight" in model and "lm_head.weight" in model:
        wte, head = model["transformer.wte.weight"].array, model["lm_head.weight"].array
        if wte.shape != head.shape or not np.array_equal(wte.view(np.uint32), head.view(np.uint32)):
            notices.append(
                f"{ranks[0].parent}: lm_head.weight differs from transformer.wte.weight (a multi-GPU GPT-2 "
                "run does not tie them: Module::To(cuda), or PP > 1); jaxtrain ties them and keeps wte"
            )
            model["lm_head.weight"] = model["transformer.wte.weight"]
    return model


def _merge_optimizer(ranks, models, optimizers, topology, num_layers, model, notices) -> dict:
    moments: dict[str, dict[str, dict[int, np.ndarray]]] = {"m": {}, "v": {}}
    counts = set()
    for rank, tensors in optimizers.items():
        path = ranks[rank] / OPTIMIZER_FILE
        if (
            "adam.t" not in tensors
            or tensors["adam.t"].dtype != KINT64
            or tensors["adam.t"].array.shape != ()
        ):
            raise LLMCFormatError(
                path,
                "tensor 'adam.t'",
                "a 0-d kINT64 (8)",
                "missing or another shape",
                "is this an Adam optimizer file?",
            )
        counts.add(int(tensors["adam.t"].array))
    if len(counts) != 1:
        raise LLMCFormatError(
            ranks[0].parent,
            "adam.t",
            "the same on every rank",
            str(sorted(counts)),
            "the rank directories are from different saves",
        )
    for stage in range(topology.pp):
        chunks, first, last = topo.stage_chunks(topology, stage, num_layers)
        _, params, chunk_params = layout.stage_orders(
            "gpt2" if "transformer.wpe.weight" in model else "llama3", chunks, first, last, topology.prefixed
        )
        for tp in range(topology.tp):
            # rank-local parameter name (unprefixed) -> its shape in this TP rank's model file
            prefix = topo.PREFIX if topology.prefixed else ""
            shapes = {
                n[len(prefix) :]: t.array.shape for n, t in models[topology.rank_of(0, tp, stage)].items()
            }
            shape_of = shapes.__getitem__
            if topology.zero_stage:
                flat = {
                    p: {k: np.full(int(np.prod(shape_of(p))), np.nan, np.float32) for k in "mv"}
                    for p in params
                }
                for rank in range(topology.world):
                    dp, rank_tp, rank_stage = topology.coords(rank)
                    if (rank_tp, rank_stage) != (tp, stage):
                        continue
                    numels = [[(p, int(np.prod(shape_of(p)))) for p in c] for c in chunk_params]
                    got = topo.pieces(numels, topology.replicas, topology.zero_shard(rank))
                    tensors = optimizers[rank]
                    _check_keys(ranks[rank] / OPTIMIZER_FILE, tensors, len(got), "ZeRO pieces")
                    for i, piece in enumerate(got):
                        for k in "mv":
                            value = tensors[f"adam.{k}.{i}"].array
                            if value.shape != (piece.stop - piece.start,):
                                raise LLMCFormatError(
                                    ranks[rank] / OPTIMIZER_FILE,
                                    f"tensor 'adam.{k}.{i}' shape",
                                    f"({piece.stop - piece.start},) (shard {topology.zero_shard(rank)}'s "
                                    f"piece of {piece.name})",
                                    str(value.shape),
                                    "the shards do not add up; were they written with "
                                    "another --zero_stage or --nproc_per_node?",
                                )
                            flat[piece.name][k][piece.start : piece.stop] = value
                local = {p: {k: flat[p][k].reshape(shape_of(p)) for k in "mv"} for p in params}
            else:
                rank = topology.rank_of(0, tp, stage)
                tensors = optimizers[rank]
                _check_keys(ranks[rank] / OPTIMIZER_FILE, tensors, len(params), "parameters")
                local = {}
                for i, p in enumerate(params):
                    local[p] = {}
                    for k in "mv":
                        value = tensors[f"adam.{k}.{i}"].array
                        if value.shape != shape_of(p):
                            raise LLMCFormatError(
                                ranks[rank] / OPTIMIZER_FILE,
                                f"tensor 'adam.{k}.{i}' shape",
                                f"{shape_of(p)} (parameter {p})",
                                str(value.shape),
                                "the optimizer file is from another run",
                            )
                        local[p][k] = value
            for p, values in local.items():
                name = topo.global_name(
                    (topo.PREFIX if topology.prefixed else "") + p, stage, topology, num_layers
                )
                for k in "mv":
                    moments[k].setdefault(name, {})[tp] = values[k]
    n_embd = topo.n_embd_of({n: t.array for n, t in model.items()})
    out = {}
    gpt2_untied = "transformer.wpe.weight" in model and "lm_head.weight" in moments["m"]
    for k in "mv":
        for name, by_tp in moments[k].items():
            if gpt2_untied and name == "lm_head.weight":
                continue  # tied in jaxtrain: wte's moments stand for both
            value = topo.tp_merge(ranks[0].parent, name, [by_tp[t] for t in range(topology.tp)], n_embd)
            out[f"adam.{k}.{name}"] = CkptTensor(KFLOAT32, np.ascontiguousarray(value))
    if gpt2_untied:
        notices.append(f"{ranks[0].parent}: lm_head.weight's Adam moments dropped (jaxtrain ties it to wte)")
    out["adam.t"] = CkptTensor(KINT64, np.array(counts.pop(), np.int64))
    return out


def _check_keys(path, tensors: dict, count: int, what: str) -> None:
    expected = {f"adam.{k}.{i}" for i in range(count) for k in "mv"} | {"adam.t"}
    if set(tensors) != expected:
        extra = sorted(set(tensors) - expected)
        missing = sorted(expected - set(tensors))
        raise LLMCFormatError(
            path,
            "Adam keys",
            f"adam.m/v.0..{count - 1} and adam.t ({count} {what} of this rank)",
            f"{len(tensors)} keys"
            + (f", unexpected {extra[0]}" if extra else "")
            + (f", missing {missing[0]}" if missing else ""),
            "the shards do not add up; were they written with another topology or --zero_stage?",
        )
