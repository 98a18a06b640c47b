"""Where each tensor of a multi-GPU InfiniTrain run lives: ranks, pipeline stages, tensor-parallel slices.

Everything here is derived from InfiniTensor/InfiniTrain b24d92f (the HEAD this project follows); each rule
names its file and lines. The one global view is the single-rank StateDict (TP = PP = 1 names, Linear weights
(out, in)), which llmc_io/infinitrain/names.py turns into our tree; this module only moves tensors between
that view and the per-rank views, and says which piece of each parameter a ZeRO rank's Adam state holds
(`pieces`, at the end).

* Rank numbering: axis order TP -> DP -> PP, so rank = tp + T*dp + T*D*pp
  (infini_train/include/nn/parallel/global.h:17 `order{TP, DP, PP}`, global.cc:22-48 InitStrides/CoordOf).
* Directories: `<save>/checkpoint_step_{:06d}/rank_{:06d}` with the global rank, whenever the run is
  parallel (example/gpt2/main.cc:513, example/llama3/main.cc:490).
* Name prefix: DistributedDataParallel and PipelineParallel both register the wrapped model as "module"
  (ddp/distributed_data_parallel.cc:21,50; pp/pipeline_parallel.cc:15,83), so with DDP > 1 or PP > 1 every
  name starts with `module.`; with PP the per-chunk DDP wrappers live in PipelineStage, outside the module
  tree (pipeline_parallel.cc:88-101, example/gpt2/main.cc:279-288), so the prefix is never doubled.
* Pipeline stages: PipelineParallel::GetStageInfo (pp/pipeline_parallel.cc:42-77) gives each stage its virtual
  chunks' layer ranges; the stage's `transformer.h` numbers its layers 0..n-1 in start-layer order
  (nn/modules/transformer/transformer.cc:221-238). wte (and GPT-2's wpe) live on stage 0, ln_f and lm_head on
  the last stage (transformer.cc:211-247).
* Tensor parallel (nn/parallel/tensor_parallel.cc:270-291 ColumnParallelLinear (out/T, in),
  :324-347 RowParallelLinear (out, in/T) with a whole bias, :391-396 VocabParallelEmbedding (V/T, C) rows
  [r*V/T, (r+1)*V/T)); which layer is which: causal_self_attention.cc:25-43 (c_attn column, c_proj row),
  mlp.cc:40-74 (c_fc, c_fc2 column; c_proj row), transformer.cc:179-186 (lm_head column). c_attn's rows of
  rank r are [q_r | k_r | v_r], not a contiguous block of [Q | K | V]:
  example/gpt2/checkpoint_loader.cc:196-279 and example/llama3/checkpoint_loader.cc:198-231 read them that
  way, and the forward splits the local output so
  (causal_self_attention.cc:94-110, 204-212).
* Sequence parallel only changes activations (trainer_state.json's sp_size is T or 1:
  example/gpt2/main.cc:152); the parameters are laid out as without it.

Context parallelism (PR 181, branch feat/context_parallel d03ba16, not merged upstream) adds a fourth axis;
these rules are derived from its code, no multi-rank file of it was ever sampled:
* Rank numbering TP -> CP -> DP -> PP: rank = tp + T*cp + T*C*dp + T*C*D*pp
  (include/nn/parallel/global.h:17 `order{TP, CP, DP, PP}`; src/nn/parallel/global.cc:24-54).
* CP ranks hold replicas of the weights, like DP ranks: the data loader is sharded by DP only
  (example/gpt2/main.cc:333-335), each CP rank takes a slice of T (:481-482, :516-517), and DDP wraps the
  model whenever DP x CP > 1 (:316, :324), so a CP 2 x DP 1 run has the `module.` prefix too.
* ZeRO-1/2 shard over the DP x CP group, whose member order is dp-major (src/nn/parallel/utils.cc:31-41
  GetDataParallelWithContextGroupRanks: for dp, for cp), so a rank's shard index is dp*C + cp
  (DistributedOptimizer gets dp_cp_world_size, dp_cp_rank: example/gpt2/main.cc:361-363). ZeRO needs
  DP x CP > 1 and ZeRO-3 is refused (:173-176).
* trainer_state.json gains cp_size between sp_size and pp_size (src/checkpoint/checkpoint.cc:196), and
  checkpoint_manager.cc:63-64 CHECKs it against the resuming run's CP size.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from llmc_io.errors import LLMCFormatError

PREFIX = "module."


@dataclasses.dataclass(frozen=True)
class Topology:
    ddp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1  # virtual pipeline chunks per stage (--virtual_pipeline_parallel); not in trainer_state.json
    sequence_parallel: bool = False
    zero_stage: int = 0  # --zero_stage: 1 and 2 shard the optimizer state over the DDP (x CP) ranks
    cp: int = 1  # --context_parallel (d03ba16)

    @property
    def world(self) -> int:
        return self.ddp * self.tp * self.cp * self.pp

    @property
    def replicas(self) -> int:
        """Ranks holding the same weights: DP x CP (the group DDP and ZeRO work over, d03ba16)."""
        return self.ddp * self.cp

    @property
    def sp(self) -> int:
        """trainer_state.json's sp_size (example/gpt2/main.cc:152)."""
        return self.tp if self.sequence_parallel else 1

    @property
    def prefixed(self) -> bool:
        return self.replicas > 1 or self.pp > 1

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, tp, pp) of a global rank (global.cc:43-48 with strides TP=1, DP=T, PP=T*D; with CP
        (d03ba16 global.cc:50-54) TP=1, CP=T, DP=T*C, PP=T*C*D)."""
        replica = self.tp * self.cp
        return (rank // replica) % self.ddp, rank % self.tp, rank // (replica * self.ddp)

    def cp_of(self, rank: int) -> int:
        """The context-parallel coordinate of a global rank (0 without CP)."""
        return (rank // self.tp) % self.cp

    def rank_of(self, dp: int, tp: int, pp: int, cp: int = 0) -> int:
        return tp + self.tp * cp + self.tp * self.cp * dp + self.tp * self.cp * self.ddp * pp

    def zero_shard(self, rank: int) -> int:
        """A rank's index in the group ZeRO shards over: dp (b24d92f), dp*C + cp (d03ba16 utils.cc:31-41)."""
        return self.coords(rank)[0] * self.cp + self.cp_of(rank)

    def validate(self, path, heads: tuple[int, int] | None = None) -> None:
        """Refuse what upstream's main.cc refuses; heads = (n_head, n_kv_head) when known."""
        for field in ("ddp", "tp", "cp", "pp", "vpp"):
            if getattr(self, field) < 1:
                raise LLMCFormatError(path, f"--{field}", "1 or more", str(getattr(self, field)))
        if self.zero_stage not in (0, 1, 2):
            # ZeRO-3 is LOG(FATAL) in ddp/distributed_data_parallel.cc:31-33
            raise LLMCFormatError(path, "--zero_stage", "0, 1 or 2", str(self.zero_stage))
        if self.zero_stage and self.replicas == 1:
            # DistributedOptimizer CHECKs ddp_world_size > 1 (ddp/distributed_optimizer.cc:15); d03ba16
            # example/gpt2/main.cc:174 CHECKs DP x CP > 1
            raise LLMCFormatError(
                path,
                "--zero_stage",
                "0 with --ddp 1" + (" and --cp 1" if self.cp == 1 else ""),
                str(self.zero_stage),
                "ZeRO shards the optimizer over data-parallel (and context-parallel) ranks; pass --ddp 2 "
                "or more",
            )
        if heads is not None:
            # causal_self_attention.cc:57,67: n_head and n_kv_head must divide by the TP size
            for what, count in zip(("n_head", "n_kv_head"), heads):
                if count % self.tp:
                    raise LLMCFormatError(
                        path,
                        what,
                        f"a multiple of --tp {self.tp}",
                        str(count),
                        "choose a --tp that divides the head counts",
                    )

    def upstream_flags(self) -> str:
        """The example binaries' flags for this layout (example/gpt2/main.cc:64,77-80; DDP is what is left of
        --nthread_per_process after TP and PP: global.cc InitAllEnv)."""
        flags = f"--nthread_per_process {self.world}"
        for flag, value, default in (
            ("tensor_parallel", self.tp, 1),
            ("context_parallel", self.cp, 1),
            ("pipeline_parallel", self.pp, 1),
            ("virtual_pipeline_parallel", self.vpp, 1),
            ("zero_stage", self.zero_stage, 0),
        ):
            if value != default:
                flags += f" --{flag} {value}"
        return flags + (" --sequence_parallel" if self.sequence_parallel else "")

    def describe(self) -> str:
        extra = f", vpp {self.vpp}" if self.vpp > 1 else ""
        extra += ", sequence parallel" if self.sequence_parallel else ""
        extra += f", ZeRO-{self.zero_stage}" if self.zero_stage else ""
        cp = f" x cp {self.cp}" if self.cp > 1 else ""
        return f"ddp {self.ddp} x tp {self.tp}{cp} x pp {self.pp}{extra}"


def chunk_ranges(num_layers: int, pp: int, stage: int, vpp: int) -> list[tuple[int, int]]:
    """PipelineParallel::GetStageInfo's layer_ranges_per_chunk (pp/pipeline_parallel.cc:42-77)."""
    per_chunk, remainder = divmod(num_layers, pp * vpp)
    ranges = []
    for local in range(vpp):
        chunk = local * pp + stage
        if chunk * per_chunk >= num_layers:
            break
        if chunk < remainder:
            start = chunk * (per_chunk + 1)
            end = start + per_chunk + 1
        else:
            start = remainder * (per_chunk + 1) + (chunk - remainder) * per_chunk
            end = start + per_chunk
        end = min(end, num_layers)
        if start < end:
            ranges.append((start, end))
    return ranges


def stage_layers(num_layers: int, pp: int, stage: int, vpp: int) -> list[int]:
    """Global layer index of each local `transformer.h.{k}` of a stage, in k order (transformer.cc:221-238:
    chunks ordered by start layer, their layers concatenated)."""
    return [i for start, end in sorted(chunk_ranges(num_layers, pp, stage, vpp)) for i in range(start, end)]


def check_pipeline(path, num_layers: int, pp: int, vpp: int) -> None:
    """Every stage must own vpp chunks: PipelineParallel's constructor asks the model for each
    `__pp_chunk_{c}`, c < vpp (pipeline_parallel.cc:89-98), which only exists if GetStageInfo gave it
    layers."""
    for stage in range(pp):
        if len(chunk_ranges(num_layers, pp, stage, vpp)) != vpp:
            raise LLMCFormatError(
                path,
                "pipeline layout",
                f"at least pp x vpp = {pp * vpp} layers (one per virtual chunk)",
                f"{num_layers} layers",
                "choose a smaller --pp / --vpp",
            )


# ---- which global tensors each rank holds ----------------------------------------------------------------


def _layer_suffix(name: str) -> tuple[int, str] | None:
    if not name.startswith("transformer.h."):
        return None
    index, _, suffix = name[len("transformer.h.") :].partition(".")
    return int(index), suffix


def stage_name(name: str, stage: int, topology: Topology, num_layers: int) -> str | None:
    """The rank-local StateDict name of a global name on pipeline stage `stage`, or None if not there."""
    last = stage == topology.pp - 1
    layer = _layer_suffix(name)
    if layer is not None:
        local = stage_layers(num_layers, topology.pp, stage, topology.vpp)
        if layer[0] not in local:
            return None
        name = f"transformer.h.{local.index(layer[0])}.{layer[1]}"
    elif name in ("transformer.wte.weight", "transformer.wpe.weight"):
        if stage != 0:
            return None
    elif not last:  # transformer.ln_f.*, lm_head.weight
        return None
    return (PREFIX if topology.prefixed else "") + name


def global_name(local: str, stage: int, topology: Topology, num_layers: int) -> str | None:
    """Inverse of stage_name; None for a name this stage cannot hold."""
    if topology.prefixed:
        if not local.startswith(PREFIX):
            return None
        local = local[len(PREFIX) :]
    layer = _layer_suffix(local)
    if layer is not None:
        layers = stage_layers(num_layers, topology.pp, stage, topology.vpp)
        if layer[0] >= len(layers):
            return None
        local = f"transformer.h.{layers[layer[0]]}.{layer[1]}"
    return local if stage_name(local, stage, topology, num_layers) is not None else None


# ---- tensor-parallel slices ------------------------------------------------------------------------------

ROWS, COLUMNS, QKV, WHOLE = "rows", "columns", "qkv", "whole"


def tp_rule(name: str) -> str:
    """How a global tensor is cut over the TP ranks (see the module docstring for the sources)."""
    if name.endswith(("attn.c_attn.weight", "attn.c_attn.bias")):
        return QKV
    if name in ("transformer.wte.weight", "lm_head.weight") or name.endswith(
        ("mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_fc2.weight")
    ):
        return ROWS
    if name.endswith(("attn.c_proj.weight", "mlp.c_proj.weight")):
        return COLUMNS
    return WHOLE  # norms, wpe, row-parallel biases, GPT-2's causal-mask buffer


def _qkv_rows(total: int, n_embd: int) -> tuple[int, int]:
    """(query rows, key rows = value rows) of c_attn: Q has n_embd rows, K and V share the rest."""
    return n_embd, (total - n_embd) // 2


def _check_divides(path, name: str, size: int, tp: int, what: str) -> None:
    if size % tp:
        raise LLMCFormatError(
            path,
            f"tensor '{name}' {what}",
            f"a multiple of tp {tp}",
            str(size),
            "choose a --tp that divides it",
        )


def tp_split(path, name: str, array: np.ndarray, tp: int, n_embd: int) -> list[np.ndarray]:
    """The TP ranks' slices of one global tensor, rank order."""
    rule = tp_rule(name)
    if tp == 1 or rule == WHOLE:
        return [array] * tp
    if rule == ROWS:
        _check_divides(path, name, array.shape[0], tp, "rows")
        return list(np.split(array, tp, axis=0))
    if rule == COLUMNS:
        _check_divides(path, name, array.shape[1], tp, "columns")
        return list(np.split(array, tp, axis=1))
    q, kv = _qkv_rows(array.shape[0], n_embd)
    _check_divides(path, name, q, tp, "query rows")
    _check_divides(path, name, kv, tp, "key/value rows")
    qs = np.split(array[:q], tp)
    ks = np.split(array[q : q + kv], tp)
    vs = np.split(array[q + kv :], tp)
    return [np.concatenate([qs[r], ks[r], vs[r]]) for r in range(tp)]


def tp_merge(path, name: str, parts: list[np.ndarray], n_embd: int) -> np.ndarray:
    """The global tensor from its TP ranks' slices (rank order); replicated tensors come from TP rank 0."""
    rule = tp_rule(name)
    tp = len(parts)
    whole = rule == WHOLE or tp == 1
    if len({p.shape for p in parts}) != 1:
        raise LLMCFormatError(
            path,
            f"tensor '{name}' shape",
            "the same on every TP rank (not split by tensor parallelism)"
            if whole
            else "the same slice shape on every TP rank",
            " / ".join(str(p.shape) for p in parts),
            "the rank directories are from different runs",
        )
    if whole:
        return parts[0]
    if rule == ROWS:
        return np.concatenate(parts, axis=0)
    if rule == COLUMNS:
        return np.concatenate(parts, axis=1)
    q = n_embd // tp
    rows = parts[0].shape[0]
    if n_embd % tp or (rows - q) % 2 or rows <= q:
        raise LLMCFormatError(
            path,
            f"tensor '{name}' rows",
            f"n_embd/tp = {n_embd}/{tp} query rows plus equal key and value rows",
            str(rows),
            "the shards do not add up to one c_attn; were they written with another --tp?",
        )
    kv = (rows - q) // 2
    return np.concatenate(
        [p[:q] for p in parts] + [p[q : q + kv] for p in parts] + [p[q + kv :] for p in parts], axis=0
    )


def n_embd_of(tensors: dict) -> int:
    """n_embd from ln_f / ln_1 (never split)."""
    for name in ("transformer.ln_f.weight", "transformer.h.0.ln_1.weight"):
        if name in tensors:
            return int(tensors[name].shape[0])
    raise KeyError("no norm weight to take n_embd from")


def stage_chunks(topology: Topology, stage: int, num_layers: int):
    """(layers per chunk of pipeline `stage`, whether it is the first stage, whether the last)."""
    chunks = tuple(b - a for a, b in sorted(chunk_ranges(num_layers, topology.pp, stage, topology.vpp)))
    return chunks, stage == 0, stage == topology.pp - 1


# --- ZeRO-1/2 optimizer pieces ----------------------------------------------------------------------
# ZeRO-1/2 optimizer shards of InfiniTrain: which piece of which parameter each DDP rank's Adam state holds.
#
# From InfiniTensor/InfiniTrain b24d92f, infini_train/src/nn/parallel/ddp/:
# * param_and_grad_buffer.cc:429-503 (ParamAndGradBuffer): the parameters of one DDP-wrapped chunk, in reverse
#   Module::Parameters() order ("backprop order"), are packed into buckets; with ZeRO each parameter starts at
#   a multiple of 64 elements (:21, :433); a bucket closes once it holds at least
#   bucket_size_in_elements (1,000,000, distributed_data_parallel_config.h:62; :478-497), and its end is
#   padded to
#   lcm(ddp, 128) (:22, :438-451, :490; pad_buckets_for_high_nccl_busbw is false by default).
# * param_and_grad_buffer.cc:63-68 (ParamAndGradBucket): within a bucket a parameter's range is counted
#   WITHOUT that padding (offsets are the running sum of numels), and distributed_optimizer.cc:37-87 cuts
#   the padded bucket length into ddp equal shards and gives rank r each parameter's overlap with shard r, as
#   one flat piece. Those pieces, bucket after bucket and chunk after chunk (distributed_optimizer.cc:17-25),
#   are the base optimizer's parameters, so Adam's `adam.m.{i}` / `adam.v.{i}` (optimizer.cc:79-90)
#   is piece i of that rank, and `adam.t` is the same on every rank.
# With context parallelism (feat/context_parallel d03ba16) the group is DP x CP: the buffer's world size
# is the group's (param_and_grad_buffer.cc:416 ddp_pg_->WorldSize()), DistributedOptimizer gets
# dp_cp_world_size and the rank's index in that group, dp*C + cp (example/gpt2/main.cc:204-207, :361-363;
# parallel/utils.cc:31-41); pass those as `ddp` and `rank`.
# Every parameter's elements are covered once over the ranks, so the pieces put back together give the full
# moment. (Upstream's parameter views in the buffer do start at the padded offsets, so where padding exists
# its optimizer updates elements shifted from the ones these ranges name; the files still hold the ranges
# above, which is what is read and written here.)

PARAM_ALIGN = 64  # param_and_grad_buffer.cc:21
BUCKET_ALIGN = 128  # param_and_grad_buffer.cc:22
BUCKET_ELEMENTS = 1_000_000  # distributed_data_parallel_config.h:62


@dataclasses.dataclass(frozen=True)
class Piece:
    name: str  # the parameter (unprefixed rank-local StateDict name)
    start: int  # first element, in the flattened parameter
    stop: int


def _buckets(numels: list[tuple[str, int]], ddp: int) -> list[tuple[list[tuple[str, int]], int]]:
    """[(params of the bucket in bucket order, padded bucket length)] of one chunk's buffer."""
    pad_to = math.lcm(ddp, BUCKET_ALIGN)
    buckets = []
    bucket_start = 0
    start = 0
    members: list[tuple[str, int]] = []
    end = 0
    for name, numel in reversed(numels):
        start = -(-start // PARAM_ALIGN) * PARAM_ALIGN
        end = start + numel
        members.append((name, numel))
        if end - bucket_start >= BUCKET_ELEMENTS:
            bucket_end = -(-end // pad_to) * pad_to
            buckets.append((members, bucket_end - bucket_start))
            members, bucket_start, start = [], bucket_end, bucket_end
        else:
            start = end
    if members:
        bucket_end = -(-end // pad_to) * pad_to
        buckets.append((members, bucket_end - bucket_start))
    return buckets


def pieces(chunks: list[list[tuple[str, int]]], ddp: int, rank: int) -> list[Piece]:
    """The base optimizer's parameters on DDP rank `rank`: chunks = each DDP-wrapped chunk's
    [(parameter name, numel)] in Module::Parameters() order."""
    out = []
    for numels in chunks:
        for members, length in _buckets(numels, ddp):
            shard = length // ddp
            lo, hi = rank * shard, (rank + 1) * shard
            offset = 0
            for name, numel in members:
                start, stop = max(offset, lo), min(offset + numel, hi)
                if stop > start:
                    out.append(Piece(name, start - offset, stop - offset))
                offset += numel
    return out
