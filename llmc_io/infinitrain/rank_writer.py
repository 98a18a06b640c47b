"""A single-rank view written back as a multi-GPU InfiniTrain step directory (`rank_NNNNNN/` per global
rank) for a named topology: the reverse of llmc_io/infinitrain/ranks.py's reading, by the same rules
(llmc_io/infinitrain/topology.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from llmc_io.infinitrain import layout
from llmc_io.infinitrain import topology as topo
from llmc_io.infinitrain.state import InfiniTrainState, write_trainer_state
from llmc_io.infinitrain.libcxx_order import LibcxxStringMap
from llmc_io.infinitrain.statedict import KFLOAT32, KINT64, CkptTensor, write_state_dict
from llmc_io.infinitrain.ranks import MODEL_FILE, OPTIMIZER_FILE, TRAINER_STATE


def write_step(
    directory,
    family: str,
    model: dict,
    optimizer: dict | None,
    state: InfiniTrainState,
    topology: topo.Topology,
    heads: tuple[int, int] | None = None,
) -> list[Path]:
    """Lay out `directory/rank_NNNNNN/` for `topology` from the single-rank StateDicts (model: global
    name -> CkptTensor with the run's vocabulary rows; optimizer: name-keyed Adam or None)."""
    directory = Path(directory)
    topology.validate(directory, heads)
    num_layers = layout_layers(model)
    topo.check_pipeline(directory, num_layers, topology.pp, topology.vpp)
    n_embd = topo.n_embd_of({n: t.array for n, t in model.items()})
    arrays = {n: t.array for n, t in model.items()}
    if family == "gpt2" and "lm_head.weight" not in arrays:
        arrays["lm_head.weight"] = arrays["transformer.wte.weight"]
    sliced = {n: topo.tp_split(directory, n, a, topology.tp, n_embd) for n, a in arrays.items()}
    moment_slices = {}
    if optimizer is not None:
        for key, tensor in optimizer.items():
            if key != "adam.t":
                name = key.split(".", 2)[2]
                moment_slices[key] = topo.tp_split(directory, name, tensor.array, topology.tp, n_embd)
    written = []
    for rank in range(topology.world):
        dp, tp, stage = topology.coords(rank)
        chunks, first, last = topo.stage_chunks(topology, stage, num_layers)
        order, params, chunk_params = layout.stage_orders(family, chunks, first, last, topology.prefixed)
        local = {}
        for name in arrays:
            local_name = topo.stage_name(name, stage, topology, num_layers)
            if local_name is not None:
                local[local_name] = CkptTensor(KFLOAT32, np.ascontiguousarray(sliced[name][tp]))
        rank_dir = directory / f"rank_{rank:06d}"
        rank_dir.mkdir(parents=True)
        write_state_dict(rank_dir / MODEL_FILE, {n: local[n] for n in order})
        if optimizer is not None:
            write_state_dict(
                rank_dir / OPTIMIZER_FILE,
                _rank_optimizer(
                    optimizer,
                    moment_slices,
                    topology,
                    rank,
                    stage,
                    num_layers,
                    local,
                    params,
                    chunk_params,
                    family,
                ),
            )
        rank_state = dataclasses.replace(
            state,
            ddp_size=topology.ddp,
            tp_size=topology.tp,
            sp_size=topology.sp,
            pp_size=topology.pp,
            # d03ba16 writes cp_size at any CP (checkpoint.cc:196); b24d92f files have none
            cp_size=topology.cp if topology.cp > 1 else state.cp_size,
            # each rank saves its own DataLoader position: rank d of DDP reads batches d, d + D, ...
            # (dataloader.cc:60-63 operator++; example/gpt2/main.cc:357-362 skips (consumed - d) / D)
            data_batch_idx=state.data_batch_idx + dp,
        )
        write_trainer_state(rank_dir / TRAINER_STATE, rank_state)
        written.append(rank_dir)
    return written


def layout_layers(model: dict) -> int:
    layers = {int(n.split(".")[2]) for n in model if n.startswith("transformer.h.")}
    return max(layers) + 1 if layers else 0


def _rank_optimizer(
    optimizer, moment_slices, topology, rank, stage, num_layers, local, params, chunk_params, family
) -> dict:
    _, tp, _ = topology.coords(rank)
    prefix = topo.PREFIX if topology.prefixed else ""

    def moment(kind: str, p: str) -> np.ndarray:
        name = topo.global_name(prefix + p, stage, topology, num_layers)
        key = f"adam.{kind}.{name}"
        if key not in moment_slices and family == "gpt2" and name == "lm_head.weight":
            key = f"adam.{kind}.transformer.wte.weight"  # one tied parameter in the global view
        return moment_slices[key][tp]

    values: dict[str, np.ndarray] = {}
    if topology.zero_stage:
        numels = [[(p, local[prefix + p].array.size) for p in c] for c in chunk_params]
        shards = topo.pieces(numels, topology.replicas, topology.zero_shard(rank))
        entries = [(pc.name, slice(pc.start, pc.stop)) for pc in shards]
    else:
        entries = [(p, None) for p in params]
    keys = LibcxxStringMap()  # Adam::StateDict emplaces m.i, v.i per parameter, then t (optimizer.cc:79-90)
    for i, (p, piece) in enumerate(entries):
        for kind in "mv":
            value = moment(kind, p)
            if piece is not None:
                value = value.reshape(-1)[piece]
            values[f"adam.{kind}.{i}"] = value
            keys.insert(f"adam.{kind}.{i}")
    keys.insert("adam.t")
    values["adam.t"] = optimizer["adam.t"].array
    return {
        k: CkptTensor(KINT64 if k == "adam.t" else KFLOAT32, np.array(values[k], order="C"))
        for k in keys.keys()
    }
