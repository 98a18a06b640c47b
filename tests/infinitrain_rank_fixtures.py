"""A stand-in for a multi-GPU InfiniTrain save: writes rank_NNNNNN/ directories as upstream's code would.

No real multi-GPU InfiniTrain files can be made here (a CPU build has no collectives), so this writer follows
InfiniTensor/InfiniTrain b24d92f line by line, written apart from llmc_io's reader and writer so that the
tests compare two readings of the same code. Every rule cites its source (paths under infini_train/ unless
they start with example/):

  R1 rank layout   include/nn/parallel/global.h:17 `order{TP, DP, PP}`; src/nn/parallel/global.cc:22-41
                   InitStrides / RankOf: rank = tp + T*dp + T*D*pp.
  R2 directories   example/gpt2/main.cc:508-515 (llama3/main.cc:485-492): checkpoint_step_{:06d}/rank_{:06d}
                   with rank.GlobalRank() when rank.IsParallel().
  R3 prefix        src/nn/parallel/ddp/distributed_data_parallel.cc:21,50 and pp/pipeline_parallel.cc:15,83:
                   the wrapped model is modules_["module"]; example/gpt2/main.cc:279-296 wraps with PP when
                   pp > 1, else with DDP when ddp > 1.
  R4 stages        src/nn/parallel/pp/pipeline_parallel.cc:42-77 GetStageInfo; transformer.cc:210-248: wte
                   (+ wpe) on the first stage, ln_f + lm_head on the last, `transformer.h.{k}` numbered
                   from 0 on each stage over its chunks in start-layer order.
  R5 TP slices     example/gpt2/checkpoint_loader.cc:114-127 (sizes), :130-147 (wte / lm_head rows
                   [tp*V/T, ...)), :196-279 (c_attn rows q_i | k_i | v_i), :281-296 (attn.c_proj columns),
                   and the same file for c_fc rows / mlp.c_proj columns; example/llama3/checkpoint_loader.cc
                   :145-165 (GQA sizes), :198-231 (c_attn), :272-318 (c_fc, c_fc2 rows; c_proj columns),
                   :327-342 (lm_head rows). Norms, wpe, the row-parallel biases and GPT-2's mask are whole.
  R6 GPT-2 vocab   example/gpt2/checkpoint_loader.cc:81-82: with TP > 1 the model vocabulary is Vp.
  R7 Adam          src/optimizer.cc:79-90 Adam::StateDict: adam.m.{i}, adam.v.{i} over the optimizer's
                   parameters, adam.t int64 0-d. Without ZeRO those are model->Parameters() of the rank
                   (example/llama3/main.cc:299); their order is libc++'s (llmc_io/infinitrain/layout.py,
                   checked against the real one-rank files).
  R8 ZeRO-1/2      src/nn/parallel/ddp/param_and_grad_buffer.cc:429-503 (buffer: reverse parameter order,
                   starts padded to 64, bucket cut at >= 1e6 elements, end padded to lcm(ddp, 128)),
                   :56-69 (a bucket's ranges count params back to back), distributed_optimizer.cc:34-88
                   (rank r's pieces: each param's overlap with [r*S, (r+1)*S), S = bucket / ddp), :17-25
                   (chunks in order); example/gpt2/main.cc:281-288 (one DDP per PP chunk).
  R9 trainer state src/checkpoint/checkpoint.cc:181-198 SaveTrainerState text (no comma after vocab_size),
                   example/gpt2/main.cc:365-385 (ddp/tp/sp/pp sizes; sp = tp with --sequence_parallel, :152),
                   consumed_batches = the rank's own DataLoader index (main.cc:441,472; dataloader.cc:60-63:
                   rank d reads batches d, d + D, ...).
With `cp` (context parallelism, branch feat/context_parallel d03ba16, the same paths at that commit):
  C1 rank layout   include/nn/parallel/global.h:17 `order{TP, CP, DP, PP}`; global.cc:24-41:
                   rank = tp + T*cp + T*C*dp + T*C*D*pp.
  C2 prefix        example/gpt2/main.cc:316,324: DDP wraps when dp_cp_world_size = D*C > 1.
  C3 ZeRO          main.cc:204-207,361-363 and src/nn/parallel/utils.cc:31-41: DistributedOptimizer over the
                   DP x CP group (ranks listed for dp, for cp), world D*C, rank dp*C + cp;
                   ddp/param_and_grad_buffer.cc:416 pads buckets to lcm(D*C, 128).
  C4 data          main.cc:333-335: the loader is sharded over DP only; consumed_batches as R9.
  C5 trainer state src/checkpoint/checkpoint.cc:185-198: the comma after vocab_size, cp_size after sp_size.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

from llmc_io.infinitrain import layout as infinitrain_layout

_F32, _I64 = 11, 8


def _ckpt_bytes(entries: dict[str, tuple[int, np.ndarray]]) -> bytes:
    """checkpoint.cc:112-140 SaveStateDict."""
    out = [struct.pack('<III', 0x54504B43, 1, len(entries))]
    for name, (code, array) in entries.items():
        data = np.ascontiguousarray(array).tobytes()
        out.append(struct.pack('<I', len(name)) + name.encode() + struct.pack('<bI', code, array.ndim))
        out.append(b''.join(struct.pack('<q', d) for d in array.shape) + struct.pack('<Q', len(data)) + data)
    return b''.join(out)


def _trainer_state(
    step: int, consumed: int, lr: float, ddp: int, tp: int, sp: int, pp: int, cp: int | None = None
) -> str:
    """checkpoint.cc:181-198, with GPT2Config()'s shape fields as main.cc writes them (any values do);
    with `cp`, d03ba16's (C5)."""
    comma = ',' if cp is not None else ''
    cp_line = f'  "cp_size": {cp},\n' if cp is not None else ''
    return (
        '{\n  "n_layer": 12,\n  "n_head": 12,\n  "n_kv_head": 12,\n  "n_embd": 768,\n'
        f'  "vocab_size": 50304{comma}\n'
        f'  "global_step": {step},\n  "consumed_batches": {consumed},\n  "last_lr": {lr:g},\n'
        f'  "ddp_size": {ddp},\n  "tp_size": {tp},\n  "sp_size": {sp},\n{cp_line}  "pp_size": {pp}\n}}\n'
    )


def stage_info(total_layers: int, pp_size: int, rank: int, chunks_per_stage: int) -> list[tuple[int, int]]:
    """R4: pipeline_parallel.cc:42-77, statement for statement."""
    ranges = []
    layers_per_chunk = total_layers // (pp_size * chunks_per_stage)
    remainder = total_layers % (pp_size * chunks_per_stage)
    for local_chunk_idx in range(chunks_per_stage):
        global_chunk_idx = local_chunk_idx * pp_size + rank
        if global_chunk_idx * layers_per_chunk >= total_layers:
            break
        if global_chunk_idx < remainder:
            chunk_start = global_chunk_idx * (layers_per_chunk + 1)
            chunk_end = chunk_start + layers_per_chunk + 1
        else:
            chunk_start = (
                remainder * (layers_per_chunk + 1) + (global_chunk_idx - remainder) * layers_per_chunk
            )
            chunk_end = chunk_start + layers_per_chunk
        chunk_end = min(chunk_end, total_layers)
        if chunk_start < chunk_end:
            ranges.append((chunk_start, chunk_end))
    return ranges


def _tp_local(name: str, full: np.ndarray, tp_rank: int, tp: int, n_embd: int) -> np.ndarray:
    """R5: what LoadFromLLMC reads into this TP rank's tensor of `name` (global, TP = 1 name)."""
    if name in ('transformer.wte.weight', 'lm_head.weight') or name.endswith(
        ('mlp.c_fc.weight', 'mlp.c_fc.bias', 'mlp.c_fc2.weight')
    ):
        rows = full.shape[0] // tp  # ReadMatrixRowShardFloat(row_start = tp_rank * rows, row_cnt = rows)
        return full[tp_rank * rows : (tp_rank + 1) * rows]
    if name.endswith(('attn.c_proj.weight', 'mlp.c_proj.weight')):
        cols = full.shape[1] // tp  # ReadMatrixColShardFloat(col_start = tp_rank * cols, col_cnt = cols)
        return full[:, tp_rank * cols : (tp_rank + 1) * cols]
    if name.endswith(('attn.c_attn.weight', 'attn.c_attn.bias')):
        q_out_rows = n_embd
        kv_out_rows = (full.shape[0] - q_out_rows) // 2
        q_local_rows, kv_local_rows = q_out_rows // tp, kv_out_rows // tp
        q = full[tp_rank * q_local_rows : (tp_rank + 1) * q_local_rows]
        k = full[q_out_rows + tp_rank * kv_local_rows : q_out_rows + (tp_rank + 1) * kv_local_rows]
        v_start = q_out_rows + kv_out_rows + tp_rank * kv_local_rows
        return np.concatenate([q, k, full[v_start : v_start + kv_local_rows]])
    return full


def _local_names(name: str, stage: int, pp: int, owned: list[int]) -> str | None:
    """R4: the stage-local name of a global tensor, or None when the stage does not hold it."""
    if name.startswith('transformer.h.'):
        layer, rest = name[len('transformer.h.') :].split('.', 1)
        if int(layer) not in owned:
            return None
        return f'transformer.h.{owned.index(int(layer))}.{rest}'
    if name in ('transformer.wte.weight', 'transformer.wpe.weight'):
        return name if stage == 0 else None
    return name if stage == pp - 1 else None


def _zero_pieces(
    chunk_params: list[list[tuple[str, int]]], ddp: int, ddp_rank: int
) -> list[tuple[str, int, int]]:
    """R8, transcribed: ParamAndGradBuffer's first pass, then DistributedOptimizer::BuildShardParams."""
    pieces = []
    for params in chunk_params:
        # ParamAndGradBuffer (zero_stage >= 1): PadParamStartIfNeeded, PadBucketEndIfNeeded,
        # UpdateBucketMetadata
        lcm_val = math.lcm(ddp, 128)
        param_start_index = bucket_start_index = param_end_index = 0
        bucket_params, buckets = [], []
        for name, numel in reversed(params):
            param_start_index = -(-param_start_index // 64) * 64
            param_end_index = param_start_index + numel
            bucket_params.append((name, numel))
            if param_end_index - bucket_start_index >= 1_000_000:
                bucket_end_index = -(-param_end_index // lcm_val) * lcm_val
                buckets.append((bucket_params, bucket_end_index - bucket_start_index))
                bucket_start_index = param_start_index = bucket_end_index
                bucket_params = []
            else:
                param_start_index = param_end_index
        if bucket_params:
            bucket_end_index = -(-param_end_index // lcm_val) * lcm_val
            buckets.append((bucket_params, bucket_end_index - bucket_start_index))
        for members, bucket_numel in buckets:
            # ParamAndGradBucket: param_to_range_ = running offsets; DistributedOptimizer: the shard overlap
            shard = bucket_numel // ddp
            shard_start, shard_end = ddp_rank * shard, (ddp_rank + 1) * shard
            current_offset = 0
            for name, numel in members:
                local_start = max(current_offset, shard_start)
                local_end = min(current_offset + numel, shard_end)
                if local_end > local_start:
                    pieces.append((name, local_start - current_offset, local_end - current_offset))
                current_offset += numel
    return pieces


def write_run(
    step_dir,
    family: str,
    model: dict[str, np.ndarray],
    adam: dict[str, tuple[np.ndarray, np.ndarray]] | None,
    adam_t: int,
    *,
    step: int,
    consumed: int,
    lr: float,
    ddp: int = 1,
    tp: int = 1,
    pp: int = 1,
    vpp: int = 1,
    zero_stage: int = 0,
    sequence_parallel: bool = False,
    cp: int | None = None,
) -> Path:
    """Every rank's files of one save. model: global TP = 1 StateDict (GPT-2 with its lm_head copy);
    adam: {parameter name: (m, v)} over the same names, or None (SGD writes no optimizer file);
    cp: d03ba16's context-parallel size (None: b24d92f, no CP axis)."""
    step_dir = Path(step_dir)
    n_embd = model['transformer.ln_f.weight'].shape[0]
    num_layers = 1 + max(int(n.split('.')[2]) for n in model if n.startswith('transformer.h.'))
    cp_size = cp or 1
    wrapped = ddp * cp_size > 1 or pp > 1  # R3, C2
    prefix = 'module.' if wrapped else ''
    sp = tp if sequence_parallel else 1
    for pp_rank in range(pp):
        ranges = stage_info(num_layers, pp, pp_rank, vpp)
        owned = [i for start, end in sorted(ranges) for i in range(start, end)]
        chunk_layers = tuple(end - start for start, end in sorted(ranges))
        first, last = pp_rank == 0, pp_rank == pp - 1
        _, param_order, chunk_orders = infinitrain_layout.stage_orders(
            family, chunk_layers, first, last, wrapped
        )
        for dp_rank, cp_rank, tp_rank in np.ndindex(ddp, cp_size, tp):
            rank = tp_rank + tp * cp_rank + tp * cp_size * dp_rank + tp * cp_size * ddp * pp_rank  # R1, C1
            local = {}
            for name, full in model.items():
                stage_local = _local_names(name, pp_rank, pp, owned)
                if stage_local is not None:
                    local[stage_local] = _tp_local(name, full, tp_rank, tp, n_embd)
            rank_dir = step_dir / f'rank_{rank:06d}'  # R2
            rank_dir.mkdir(parents=True)
            (rank_dir / 'model.ckpt').write_bytes(
                _ckpt_bytes({prefix + n: (_F32, local[n]) for n in sorted(local)})
            )
            if adam is not None:
                by_local = {}
                for name, (m, v) in adam.items():
                    stage_local = _local_names(name, pp_rank, pp, owned)
                    if stage_local is not None:
                        by_local[stage_local] = (
                            _tp_local(name, m, tp_rank, tp, n_embd),
                            _tp_local(name, v, tp_rank, tp, n_embd),
                        )
                if zero_stage:
                    numels = [[(p, by_local[p][0].size) for p in chunk] for chunk in chunk_orders]
                    moments = [
                        (by_local[p][0].reshape(-1)[a:b], by_local[p][1].reshape(-1)[a:b])
                        for p, a, b in _zero_pieces(numels, ddp * cp_size, dp_rank * cp_size + cp_rank)
                    ]
                else:
                    moments = [by_local[p] for p in param_order]
                entries = {}
                for i, (m, v) in enumerate(moments):  # R7
                    entries[f'adam.m.{i}'] = (_F32, m)
                    entries[f'adam.v.{i}'] = (_F32, v)
                entries['adam.t'] = (_I64, np.array(adam_t, np.int64))
                (rank_dir / 'optimizer.ckpt').write_bytes(_ckpt_bytes(entries))
            (rank_dir / 'trainer_state.json').write_text(  # R9
                _trainer_state(step, consumed + dp_rank, lr, ddp, tp, sp, pp, cp)
            )
    return step_dir
