"""Pipeline parallelism: the mesh axis `pipeline` (parallel/sharding.py) carries P stages, the model's
L stacked layers are cut into P × V chunks, and gradient accumulation's micro-steps become
the microbatches that flow through them. `pipeline_loss_and_grads` replaces the step's
micro-step scan (setup.py); it is a pure function of the parameters and the batch, so the
train step stays one program jitted once.

Axis letters: M microbatches (the accumulation micro-steps), B rows, T time, C channels,
V chunks per stage (virtual_pipeline_parallel), S stage layers per chunk.

Layers and chunks, as InfiniTrain assigns them (infini_train/src/nn/parallel/pp/
pipeline_parallel.cc, GetStageInfo, at commit b24d92f): chunk c holds layers
[c·L/(P·V), (c+1)·L/(P·V)) and lives on stage c mod P as its local chunk c div P; the
embedding runs on the first stage (before chunk 0) and ln_f, the head and the loss on the
last (after chunk P·V - 1). The parameters stay ONE global tree in layer order: the
`h/...` tensors are split on L over `pipeline` in contiguous blocks (sharding.py), which
is exactly the chunk layout for V = 1; for V > 1 the step regroups them into the
interleaved chunks (a reshape (L) -> (V, P, S) whose P axis is the stage), and XLA moves
the layers that change stage once per step (and their gradients back). Checkpoints
therefore need nothing: a P = 2 checkpoint is the same tree as a P = 1 one.

The schedule is GPipe (InfiniTrain's default, GenerateGPipeSchedule there): every
microbatch's forward, then every backward. The forward is written here, one tick per
scan iteration, inside a `shard_map` that is manual over `pipeline` only (data, fsdp and
tensor stay with the compiler, so the axes combine): at tick t stage s works on item
i = t - s (microbatch i mod M, local chunk i div M), then passes its activations to stage
s + 1 with one `ppermute` (stage P - 1 wraps to stage 0, which stashes them for the next
local chunk: the circular schedule that V > 1 needs). Differentiating it gives the
backward schedule for free: the transpose of a ppermute is the ppermute the other way,
and the scan runs backwards. Ticks: M·V + P - 1 each way, so the bubble (the share of
stage-ticks without work) is (P - 1) / (M·V + P - 1). Why GPipe and not 1F1B: in this
SPMD form 1F1B would have to interleave forward and backward by hand (a custom VJP
around the whole schedule); GPipe gets the backward from autodiff, bit-exact and with the
same bubble as non-interleaved 1F1B. Its cost is memory: a stage keeps something for
every microbatch until the backward starts. Here that is little: each chunk is
rematerialised (its (B, T, C) input is kept, its insides recomputed in the backward), and
the head and loss run once on the last stage over all M microbatches' outputs, so one
vocabulary-sized dW is held, not one per tick. Memory per device falls as P grows
(measured by tests/tools/test_pipeline_bench.py; BENCHMARKS.md has the figures).

The three parts a pipeline cuts a model into: what the first stage runs before the
blocks (the embedding), a chunk of the stacked blocks, and what the last stage runs after
them (the final norm; the head and loss are vocab_table.py's, as in the unpipelined step).

Axis letters: B batch, T time, C channels, H2 half the head dim.

Each part does exactly what the model's own `features` does around its `apply_blocks`
call (gpt2.py, llama3.py), so a pipelined loss equals the unpipelined one up to fp32
rounding (tests/train/test_pipeline.py holds them to it). They read the model's
modules rather than adding methods to the model classes, which other work edits.
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
import numpy as np

from jaxtrain.models.vocab_table import lm_head_cross_entropy
from jaxtrain.parallel.sharding import CONTEXT, PIPELINE, context_size, pipeline_size
from jaxtrain.models.vocab_table import embedding_lookup
from jaxtrain.models.layer_stack import apply_blocks


STACKED = 'h'  # the parameter subtree whose tensors carry the layer axis first (layer_stack.py)


def stage_layers(num_layers: int, stages: int, virtual: int) -> list[list[range]]:
    """For each stage, the layers of each of its local chunks, in the order it runs them."""
    size = num_layers // (stages * virtual)
    return [
        [range((v * stages + s) * size, (v * stages + s + 1) * size) for v in range(virtual)]
        for s in range(stages)
    ]


def bubble_fraction(stages: int, virtual: int, microbatches: int) -> float:
    """Share of stage-ticks without work in this schedule: (P - 1) / (M·V + P - 1)."""
    return (stages - 1) / (microbatches * virtual + stages - 1)


def _index(x, i):
    return jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)


def make_pipeline_loss_and_grads(graphdef: nnx.GraphDef, vocab_size: int, mesh: Mesh, virtual: int):
    """Returns loss_and_grads(params, inputs_MxBxT, targets_MxBxT) -> (loss, grads): the mean
    over microbatches of each one's mean loss and the mean of their gradients, as the
    unpipelined micro-step scan gives them (setup.py)."""
    return jax.value_and_grad(make_pipeline_loss(graphdef, vocab_size, mesh, virtual))


def make_pipeline_loss(graphdef: nnx.GraphDef, vocab_size: int, mesh: Mesh, virtual: int):
    """Returns loss(params, inputs_MxBxT, targets_MxBxT): the forward schedule alone."""
    stages = pipeline_size(mesh)
    V = virtual
    send_to_next = [(s, (s + 1) % stages) for s in range(stages)]
    # With context parallelism the region is manual over `context` too: each device runs its
    # slice of T (the positions offset to it), attention crosses the axis inside
    # (context_parallel.py), and the loss is the mean over the slices' equal-sized means.
    slices = context_size(mesh)
    manual = (PIPELINE, CONTEXT) if slices > 1 else (PIPELINE,)

    def stage_program(rest, chunks, inputs_MxBxT, targets_MxBxT):
        """One stage's view: `chunks` are its V local chunks, (V, 1, S, ...) per tensor."""
        stage = jax.lax.axis_index(PIPELINE)
        varying = lambda x: jax.lax.pcast(x, manual, to='varying')
        # Every stage holds the replicated parameters (embedding, ln_f, head) but uses its own
        # copy (the first stage the embedding, the last the head): marked varying over the
        # stages, their gradients are summed over them where the copies are made (the
        # transpose of pcast), and the custom VJPs of the head and the embedding see
        # per-stage weights, as their gradients are.
        rest = jax.tree.map(varying, rest)
        chunks = jax.tree.map(lambda p: p[:, 0], chunks)
        model = nnx.merge(graphdef, nnx.State({**rest, STACKED: jax.tree.map(lambda p: p[0], chunks)}))
        block_def = nnx.split(model.h)[0]
        head_weight, vocab_axis = model.head_weight()
        M, B, T = inputs_MxBxT.shape
        # The ids whole on every device: with fsdp and tensor both > 1, XLA's partitioner
        # (jax 0.11.2) aborts inside this manual region on the embedding gather and on the
        # loss's target compare when the ids are split over fsdp and the table's channels
        # too. Int ids are cheap to gather; the activations stay split.
        inputs_MxBxT = jax.lax.with_sharding_constraint(inputs_MxBxT, P())
        targets_MxBxT = jax.lax.with_sharding_constraint(targets_MxBxT, P())
        items = M * V
        first_position = jax.lax.axis_index(CONTEXT) * T if slices > 1 else 0
        slice_embed = lambda tokens_BxT: embed(model, tokens_BxT, first_position, T * slices)
        _, extra = slice_embed(inputs_MxBxT[0])

        # Rematerialised: the backward recomputes a chunk's insides from its input, so a
        # stage keeps one (B, T, C) input per tick instead of every layer's activations of
        # all M microbatches (GPipe's memory), for one more forward pass of the blocks.
        remat_chunk = jax.checkpoint(
            lambda params, x_BxTxC: run_chunk(
                block_def, params, x_BxTxC, extra, model.scan_layers, distinct_attention=model.deterministic
            )
        )

        def tick(carry, t):
            received_BxTxC, stash_MxBxTxC = carry
            # Outside items 0..M·V-1 a stage has no work: it runs a clipped item, and nothing
            # reads the result (the bubble).
            item = jnp.clip(t - stage, 0, items - 1)
            chunk, micro = item // M, item % M
            if V > 1:
                # What stage P - 1 sent at tick t - 1 (item t - P) is the input of stage 0's
                # next local chunk for that microbatch, due at tick t - P + M (M >= P).
                stash_MxBxTxC = jax.lax.dynamic_update_index_in_dim(
                    stash_MxBxTxC, received_BxTxC, (t - stages) % M, 0
                )
                from_last_stage = _index(stash_MxBxTxC, t % M)
            else:
                from_last_stage = received_BxTxC
            embedded_BxTxC = slice_embed(_index(inputs_MxBxT, micro))[0]
            x_BxTxC = jnp.where(
                stage == 0, jnp.where(chunk == 0, embedded_BxTxC, from_last_stage), received_BxTxC
            )
            chunk_params = jax.tree.map(lambda p: _index(p, chunk), chunks)
            y_BxTxC = remat_chunk(chunk_params, x_BxTxC)
            received_BxTxC = jax.lax.ppermute(y_BxTxC, PIPELINE, send_to_next)
            return (received_BxTxC, stash_MxBxTxC), y_BxTxC

        zeros_BxTxC = varying(jnp.zeros((B, T, model.config.channels), model.dtype))
        stash_MxBxTxC = varying(jnp.zeros((M if V > 1 else 1, B, T, model.config.channels), model.dtype))
        _, y_TICKSxBxTxC = jax.lax.scan(tick, (zeros_BxTxC, stash_MxBxTxC), jnp.arange(items + stages - 1))
        # The last stage finishes microbatch m at tick (V - 1)·M + m + P - 1: a static slice.
        first = (V - 1) * M + stages - 1
        y_MxBxTxC = y_TICKSxBxTxC[first : first + M]

        def head_loss(y_MxBxTxC, targets_MxBxT):
            # All microbatches in one call, as (B, M·T): the fused head keeps one dW for the
            # backward (one per microbatch inside the scan would hold M vocabulary-sized
            # copies), and the mean over B·M·T rows is the mean of the microbatch means.
            C = y_MxBxTxC.shape[-1]
            h_BxMTxC = finish(model, jnp.moveaxis(y_MxBxTxC, 0, 1).reshape(B, M * T, C))
            targets_BxMT = jnp.moveaxis(targets_MxBxT, 0, 1).reshape(B, M * T)
            return lm_head_cross_entropy(h_BxMTxC, head_weight, targets_BxMT, vocab_size, vocab_axis)

        def no_loss(y_MxBxTxC, targets_MxBxT):
            return varying(jnp.float32(0))

        loss = jax.lax.cond(stage == stages - 1, head_loss, no_loss, y_MxBxTxC, targets_MxBxT)
        loss = jax.lax.psum(loss, PIPELINE)  # the last stage's, the others give 0
        return jax.lax.pmean(loss, CONTEXT) if slices > 1 else loss

    tokens = P(None, None, CONTEXT) if slices > 1 else P()
    program = jax.shard_map(
        stage_program,
        mesh=mesh,
        in_specs=(P(), P(None, PIPELINE), tokens, tokens),
        out_specs=P(),
        axis_names=frozenset(manual),
    )

    def loss_fn(params, inputs_MxBxT, targets_MxBxT):
        rest = {name: tree for name, tree in params.items() if name != STACKED}
        # (L, ...) -> (V, P, S, ...): chunk c = v·P + s at [v, s], so the P axis is the stage.
        chunks = jax.tree.map(
            lambda p: p.reshape(V, stages, p.shape[0] // (V * stages), *p.shape[1:]), params[STACKED]
        )
        return program(rest, chunks, inputs_MxBxT, targets_MxBxT)

    return loss_fn


def embed(model, tokens_BxT, first_position=0, whole_length=None):
    """(x_BxTxC, extra): the first block's input and the extra arguments every block takes.
    Under context parallelism `tokens_BxT` is one slice of sequences `whole_length` long,
    starting at `first_position` (traced): the positions are that slice's."""
    T = tokens_BxT.shape[1]
    whole_length = whole_length or T
    x_BxTxC = embedding_lookup(model.wte.embedding[...], tokens_BxT, model.deterministic).astype(model.dtype)
    if hasattr(model, 'wpe'):  # GPT-2: learned positions
        positions_TxC = jax.lax.dynamic_slice_in_dim(model.wpe.embedding[...], first_position, T, 0)
        return x_BxTxC + positions_TxC.astype(model.dtype)[None], ()
    # LLaMA-3: the RoPE tables, from the host in float64 as llama3.LLaMA3.features makes them.
    from jaxtrain.models.llama3 import rope_frequencies

    config = model.config
    freqs_H2 = rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    angles_TxH2 = np.arange(whole_length, dtype=np.float64)[:, None] * freqs_H2[None, :]
    extra = tuple(
        jax.lax.dynamic_slice_in_dim(jnp.asarray(table, jnp.float32), first_position, T, 0)
        for table in (np.cos(angles_TxH2), np.sin(angles_TxH2))
    )
    return x_BxTxC, extra


def run_chunk(block_def, chunk_params: dict, x_BxTxC, extra, scan: bool, distinct_attention: bool = False):
    """The stacked blocks of one chunk (parameters with a leading axis of its layers), in order."""
    block = nnx.merge(block_def, nnx.State(chunk_params))
    return apply_blocks(block, x_BxTxC, *extra, scan=scan, distinct_attention=distinct_attention)


def finish(model, x_BxTxC):
    """The final hidden states (after ln_f) in the compute dtype, as `features` returns them."""
    return model.ln_f(x_BxTxC).astype(model.dtype)
