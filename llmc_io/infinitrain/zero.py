"""ZeRO-1/2 optimizer shards of InfiniTrain: which piece of which parameter each DDP rank's Adam state holds.

From InfiniTensor/InfiniTrain b24d92f, infini_train/src/nn/parallel/ddp/:
* param_and_grad_buffer.cc:429-503 (ParamAndGradBuffer): the parameters of one DDP-wrapped chunk, in reverse
  Module::Parameters() order ("backprop order"), are packed into buckets; with ZeRO each parameter starts at
  a multiple of 64 elements (:21, :433); a bucket closes once it holds at least
  bucket_size_in_elements (1,000,000, distributed_data_parallel_config.h:62; :478-497), and its end is
  padded to
  lcm(ddp, 128) (:22, :438-451, :490; pad_buckets_for_high_nccl_busbw is false by default).
* param_and_grad_buffer.cc:63-68 (ParamAndGradBucket): within a bucket a parameter's range is counted
  WITHOUT that padding (offsets are the running sum of numels), and distributed_optimizer.cc:37-87 cuts
  the padded bucket length into ddp equal shards and gives rank r each parameter's overlap with shard r, as
  one flat piece. Those pieces, bucket after bucket and chunk after chunk (distributed_optimizer.cc:17-25),
  are the base optimizer's parameters, so Adam's `adam.m.{i}` / `adam.v.{i}` (optimizer.cc:79-90)
  is piece i of that rank, and `adam.t` is the same on every rank.
With context parallelism (feat/context_parallel d03ba16) the group is DP x CP: the buffer's world size
is the group's (param_and_grad_buffer.cc:416 ddp_pg_->WorldSize()), DistributedOptimizer gets
dp_cp_world_size and the rank's index in that group, dp*C + cp (example/gpt2/main.cc:204-207, :361-363;
parallel/utils.cc:31-41); pass those as `ddp` and `rank`.
Every parameter's elements are covered once over the ranks, so the pieces put back together give the full
moment. (Upstream's parameter views in the buffer do start at the padded offsets, so where padding exists
its optimizer updates elements shifted from the ones these ranges name; the files still hold the ranges
above, which is what is read and written here.)
"""

from __future__ import annotations

import dataclasses
import math

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
