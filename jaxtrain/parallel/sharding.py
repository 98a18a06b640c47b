"""The device mesh a run trains on, from the config keys mesh_data, mesh_fsdp, mesh_tensor.

Axes, in this order (the slowest-varying first, so `data` spans hosts and `tensor` stays
inside one):
  data    plain data parallelism: parameters replicated, the batch split
  fsdp    fully sharded data parallelism: the batch split and parameters and optimizer
          state sharded (below)
  context (only with context_parallel C > 1, between fsdp and tensor) context parallelism:
          each sequence cut into C contiguous slices along T, one per device, as
          InfiniTrain's SliceAlongCPRegionFunc cuts it; parameters replicated over it; the
          attention crosses it (context_parallel.py). Rows are not split over it: the data
          order and the tokens of a step do not depend on C
  tensor  tensor parallelism inside the MLP and attention projections (below); the
          batch is not split over it
  pipeline  (only with pipeline_parallel P > 1, then the first axis) pipeline stages: the
          layer-stacked parameters split on L, the rest replicated over it; the batch is
          not split over it (pipeline.py runs the microbatch schedule)
With stages and context, the order is InfiniTrain's rank order read slowest first:
pipeline, data, context, tensor (global.h at d03ba16: TP-CP-DP-PP, TP fastest).
One size may be -1: it takes the devices the others leave (within a stage and context). The defaults
(data -1, fsdp 1, tensor 1) are plain data parallelism over every device, so one GPU box
needs nothing set.

Axes are `AxisType.Auto`: the compiler propagates shardings through the step (jax.make_mesh
would make them Explicit, which asks every operation for a sharding rule).

Where every array of the training state and the batch lives on that mesh (the placement).

Parameters (names as in PARAMS_SPEC.md; `h/...` tensors carry the layer axis L first,
and the axes below are counted after it). One table, RULES, names the axes:
  tensor  Megatron's split of the MLP and of the attention output: c_fc and c_fc2 by
          output column, the MLP's c_proj and attention's c_proj by input row (heads), so
          each block needs one all-reduce per projection pair and the GELU/SwiGLU between
          stays local. c_attn stays whole over `tensor`: its fused Q|K|V columns would cut
          across the Q/K/V boundaries (and across heads) for most sizes.
  fsdp    every matrix is split on its model-width axis C (MaxText's 'embed' -> fsdp), so
          it never competes with `tensor` for an axis and the vocabulary tables never pull
          the logits (B, T, V) off the batch split; the compiler gathers each layer's
          matrices inside the layer scan. A 2-D+ tensor the table does not name, or whose
          C the fsdp size does not divide, is split on its largest axis that it divides.
          L is never split (the scan would gather it every iteration); vectors (biases,
          norm scales) are replicated.
  data    parameters are replicated over it.
  pipeline (meshes with stages only) the layer axis L of every `h/...` tensor, in
          contiguous blocks of L/P layers (pipeline.py regroups them into the interleaved
          chunks when V > 1); everything else is replicated over it.
The optimizer state gets its parameter's sharding wherever it holds a copy of the
parameter tree (Adam's mu and nu); its counters are replicated.

ZeRO (`zero_stage`, as InfiniTrain's --zero_stage and DeepSpeed define the stages) splits
over `data` too (over data × context with context parallelism: InfiniTrain's DP×CP group,
shard dp·C + cp, GetDataParallelWithContextGroupRanks in parallel/utils.cc at d03ba16), on
an axis of the tensor the rules above leave free (the largest that the data size divides;
never L): stage 1 the optimizer state's copies of the parameters, stage 2
also the gradients (the train step constrains them, so XLA reduce-scatters them and the
accumulated gradient is kept split; at stage 1 they are pinned whole), stage 3 also the
parameters (FSDP over `data`).

The batch (A micro-steps, B rows, T) is split on B over data × fsdp and replicated over
tensor; with context parallelism T is split over `context` in contiguous slices. With one
process the host's global batch is `device_put`; with several, every process holds the same
host value (the data stream is a pure function of its position) and hands each of its
devices only that device's slice.

Megatron sequence parallelism (`--sequence_parallel`, InfiniTrain's flag; config key
`sequence_parallel`): between the tensor-parallel regions, the residual stream and the
norms that read it are split along T over the `tensor` axis instead of being held whole on
every tensor-parallel device.

The models mark those activations with `split_over_time(x_BxTxC)` (after each residual add,
and between blocks); the train step turns the marks on for its trace with
`activations_split(sharding)`. The compiler then replaces each row-parallel projection's
all-reduce by a reduce-scatter along T and gathers T back before the column-parallel ones,
so the per-device activation memory of those regions falls by the tensor size. Off (the
default) the marks are no-ops and the compiled step is unchanged.
"""

import contextlib
import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ('data', 'fsdp', 'tensor')
PIPELINE = 'pipeline'  # only in meshes with more than one stage, so P = 1 runs are unchanged
CONTEXT = 'context'  # only in meshes with context_parallel > 1, so C = 1 runs are unchanged
BATCH_AXES = ('data', 'fsdp')  # the batch rows are split over these; see data/stream.py's batch_geometry


def select_devices(num_devices: int) -> list:
    """The first `num_devices` devices (0 = all). With several processes every device takes
    part: a subset would leave some processes without a device in the mesh."""
    available = jax.devices()
    if num_devices > len(available):
        raise ValueError(
            f'num_devices: expected at most the {len(available)} devices present, found {num_devices}'
        )
    if jax.process_count() > 1 and num_devices not in (0, len(available)):
        raise ValueError(
            f'num_devices: expected 0 (all) or {len(available)} with {jax.process_count()} processes, '
            f'found {num_devices}; every process must own devices of the mesh'
        )
    return available[:num_devices] if num_devices else available


def mesh_shape(device_count: int, data: int, fsdp: int, tensor: int) -> dict[str, int]:
    """{'data': ..., 'fsdp': ..., 'tensor': ...} with a -1 filled in; the sizes multiply to
    `device_count`."""
    sizes = {'data': data, 'fsdp': fsdp, 'tensor': tensor}
    for axis, size in sizes.items():
        if size == 0 or size < -1:
            raise ValueError(f'mesh_{axis}: expected a positive size or -1 (fill), found {size}')
    fill = [axis for axis, size in sizes.items() if size == -1]
    if len(fill) > 1:
        raise ValueError(
            f"mesh: expected at most one size -1, found {len(fill)} "
            f"({', '.join('mesh_' + a for a in fill)}); "
            'set all but one of them'
        )
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if fill:
        if device_count % fixed:
            raise ValueError(
                f'mesh_{fill[0]}: -1 fills {device_count} devices, but the other sizes multiply to '
                f'{fixed}, which does not divide {device_count}; change the sizes or num_devices'
            )
        sizes[fill[0]] = device_count // fixed
    elif fixed != device_count:
        raise ValueError(
            f'mesh: expected mesh_data × mesh_fsdp × mesh_tensor = {device_count} devices, found '
            f'{data} × {fsdp} × {tensor} = {fixed}; set one of them to -1 to fill the rest'
        )
    return sizes


def pipeline_stages(stages: int, device_count: int) -> int:
    """`stages` (pipeline_parallel) once it is known to fit `device_count` devices."""
    if stages < 1:
        raise ValueError(f'pipeline_parallel: expected a positive number of stages, found {stages}')
    if stages > device_count:
        raise ValueError(
            f'pipeline_parallel: expected at most the {device_count} devices of the run, found {stages} '
            'stages; lower --pipeline_parallel or raise --num_devices'
        )
    if device_count % stages:
        raise ValueError(
            f'pipeline_parallel: expected a divisor of the {device_count} devices of the run, '
            f'found {stages}; '
            'every stage needs the same devices'
        )
    return stages


def context_slices(context: int, device_count: int) -> int:
    """`context` (context_parallel) once it is known to fit `device_count` devices."""
    if context < 1:
        raise ValueError(f'context_parallel: expected a positive size, found {context}; pass 1 (off) or more')
    if device_count % context:
        raise ValueError(
            f'context_parallel: expected a divisor of the {device_count} devices left per pipeline stage, '
            f'found {context}; lower --context_parallel or change --num_devices'
        )
    return context


def mesh_sizes(config, device_count: int) -> dict[str, int]:
    """{axis: size} of the run's mesh on `device_count` devices, `pipeline` and `context`
    included (1 without stages or context); refuses sizes that do not fit, in one line
    naming the key."""
    stages = pipeline_stages(config.get('pipeline_parallel', 1), device_count)
    context = context_slices(config.get('context_parallel', 1), device_count // stages)
    within = [f'{stages} pipeline stages'] * (stages > 1) + [f'{context} context slices'] * (context > 1)
    try:
        sizes = mesh_shape(
            device_count // (stages * context), config.mesh_data, config.mesh_fsdp, config.mesh_tensor
        )
    except ValueError as error:
        if not within:
            raise
        raise ValueError(f'{error} (the devices of one of the {" × ".join(within)})') from None
    sizes[PIPELINE] = stages
    sizes[CONTEXT] = context
    return sizes


def mesh_axes(sizes: dict[str, int]) -> tuple[str, ...]:
    """The axis names of a mesh of `sizes`, slowest first; pipeline and context only when > 1."""
    axes = ('data', 'fsdp') + (CONTEXT,) * (sizes.get(CONTEXT, 1) > 1) + ('tensor',)
    return axes if sizes.get(PIPELINE, 1) == 1 else (PIPELINE,) + axes


def build_mesh(config) -> Mesh:
    devices = select_devices(config.num_devices)
    sizes = mesh_sizes(config, len(devices))
    axes = mesh_axes(sizes)
    return jax.make_mesh(
        tuple(sizes[a] for a in axes), axes, axis_types=(AxisType.Auto,) * len(axes), devices=devices
    )


def pipeline_size(mesh: Mesh) -> int:
    """Pipeline stages of `mesh` (1 when it has no pipeline axis)."""
    return mesh.shape.get(PIPELINE, 1)


def context_size(mesh: Mesh) -> int:
    """Context slices of `mesh` (1 when it has no context axis)."""
    return mesh.shape.get(CONTEXT, 1)


def data_parallel_size(mesh: Mesh) -> int:
    """Ranks the batch is split over (data × fsdp): `batch_size` rows go to each."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def describe(mesh: Mesh) -> str:
    """'data 2 × fsdp 4 × tensor 1' (after 'pipeline 2 × ' with stages) for the log and the
    trainer state."""
    return ' × '.join(f'{axis} {mesh.shape[axis]}' for axis in mesh.axis_names)


# --- the placement ---
# Parameter-name suffix -> (axis `tensor` splits, axis `fsdp` splits), None for neither.
RULES = {
    'wte/embedding': (None, 1),  # (V, C)
    'wpe/embedding': (None, 1),  # (maxT, C)
    'lm_head/kernel': (None, 0),  # (C, V)
    'attn/c_attn/kernel': (None, 0),  # (C, Q|K|V)
    'attn/c_proj/kernel': (0, 1),  # (heads × H, C): row-parallel
    'mlp/c_fc/kernel': (1, 0),  # (C, 4C or H): column-parallel
    'mlp/c_fc/bias': (0, None),  # follows c_fc's columns
    'mlp/c_fc2/kernel': (1, 0),  # LLaMA-3's gate, like c_fc
    'mlp/c_proj/kernel': (0, 1),  # (4C or H, C): row-parallel
    # LoRA adapters (models/lora.py) split over `tensor` like their base, InfiniTrain's way:
    # a row-parallel A (r, in) by its input, a column-parallel B (out, r) by its output.
    'attn/c_proj/lora_A': (1, None),
    'mlp/c_proj/lora_A': (1, None),
    'mlp/c_fc/lora_B': (0, None),
    'mlp/c_fc2/lora_B': (0, None),
}
LAYER_STACKED_PREFIX = 'h/'  # these tensors carry the layer axis first


def _dict_path(path) -> str:
    """'h/attn/c_attn/kernel' from the trailing dictionary keys of a key path (the part
    that names a parameter, also inside the optimizer state)."""
    names = []
    for key in reversed(path):
        if not isinstance(key, jax.tree_util.DictKey):
            break
        names.append(str(key.key))
    return '/'.join(reversed(names))


def parameter_spec(name: str, shape: tuple, mesh: Mesh) -> P:
    """The PartitionSpec of the parameter `name` of `shape` on `mesh` (rules above)."""
    spec = [None] * len(shape)
    first = 1 if name.startswith(LAYER_STACKED_PREFIX) else 0  # skip the layer axis
    tensor, fsdp = mesh.shape['tensor'], mesh.shape['fsdp']
    rule = next((RULES[suffix] for suffix in RULES if name.endswith(suffix)), (None, None))
    # A tensor without the rule's axis (another layout) falls back to the generic fsdp rule.
    tensor_axis, fsdp_axis = (None if a is None or first + a >= len(shape) else first + a for a in rule)
    if tensor > 1 and tensor_axis is not None and shape[tensor_axis] % tensor == 0:
        spec[tensor_axis] = 'tensor'
    if fsdp > 1 and len(shape) - first >= 2:
        if fsdp_axis is not None and spec[fsdp_axis] is None and shape[fsdp_axis] % fsdp == 0:
            spec[fsdp_axis] = 'fsdp'
        else:
            free = [a for a in range(first, len(shape)) if spec[a] is None and shape[a] % fsdp == 0]
            if free:
                spec[max(free, key=lambda a: (shape[a], -a))] = 'fsdp'
    if first and mesh.shape.get('pipeline', 1) > 1:
        spec[0] = 'pipeline'  # fit_checks.check_pipeline made sure P divides L
    while spec and spec[-1] is None:  # P() for a replicated tensor, as Orbax and ckpt show it
        spec.pop()
    return P(*spec)


def zero_spec(name: str, shape: tuple, mesh: Mesh) -> P:
    """parameter_spec with the `data` axis added on a free axis it divides (ZeRO's split of
    a tensor over the data-parallel ranks); unchanged where there is none or data is 1."""
    spec = list(parameter_spec(name, shape, mesh))
    spec += [None] * (len(shape) - len(spec))
    axes = ('data', CONTEXT) if CONTEXT in mesh.shape else 'data'
    data = mesh.shape['data'] * mesh.shape.get(CONTEXT, 1)
    first = 1 if name.startswith(LAYER_STACKED_PREFIX) else 0
    free = [a for a in range(first, len(shape)) if spec[a] is None and shape[a] % data == 0]
    if data > 1 and free:
        spec[max(free, key=lambda a: (shape[a], -a))] = axes
    while spec and spec[-1] is None:
        spec.pop()
    return P(*spec)


def _spec(name: str, shape: tuple, mesh: Mesh, zero: bool) -> P:
    return zero_spec(name, shape, mesh) if zero else parameter_spec(name, shape, mesh)


def parameter_shardings(params, mesh: Mesh, zero_stage: int = 0):
    """A tree like `params` of NamedShardings (split over data too from ZeRO stage 3)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, _spec(_dict_path(path), x.shape, mesh, zero_stage >= 3)), params
    )


def gradient_shardings(params, mesh: Mesh, zero_stage: int):
    """Where the train step keeps the gradients: from ZeRO stage 2 split over data; at stage
    1 laid out like the parameters (all-reduced: every rank holds the whole gradient, as
    ZeRO-1 defines it; left alone, the compiler would split them after the optimizer state
    and make stage 1 a stage 2); at stage 0 None (the compiler's choice)."""
    if zero_stage == 0:
        return None
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, _spec(_dict_path(path), x.shape, mesh, zero_stage >= 2)), params
    )


def opt_state_shardings(opt_state, params, mesh: Mesh, zero_stage: int = 0):
    """A tree like `opt_state`: a leaf that is a copy of a parameter (same name at the end
    of its path, same shape) gets that parameter's sharding (split over data too from ZeRO
    stage 1); everything else is replicated. `opt_state` may be abstract (jax.eval_shape)."""
    shapes = {_dict_path(path): tuple(x.shape) for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}

    def sharding(path, x):
        name = _dict_path(path)
        if shapes.get(name) == tuple(x.shape):
            return NamedSharding(mesh, _spec(name, tuple(x.shape), mesh, zero_stage >= 1))
        return NamedSharding(mesh, P())

    return jax.tree_util.tree_map_with_path(sharding, opt_state)


def batch_sharding(mesh: Mesh, micro_steps: bool) -> NamedSharding:
    """B split over data × fsdp (and T over context), for (A, B, T) with `micro_steps`, else
    for (B, T)."""
    spec = (BATCH_AXES, CONTEXT) if CONTEXT in mesh.shape else (BATCH_AXES,)
    return NamedSharding(mesh, P(None, *spec) if micro_steps else P(*spec))


def put_global(tree, shardings):
    """Host values -> global arrays with `shardings` (a matching tree, or one sharding for
    all). Every process must pass the same values; each supplies only its devices' slices."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def put(x, sharding):
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: put(x, shardings), tree)
    return jax.tree.map(put, tree, shardings)


def describe_sharded(shardings) -> str:
    """'12 of 16 parameter tensors sharded' for the start-up log."""
    specs = [s.spec for s in jax.tree.leaves(shardings)]
    sharded = sum(1 for spec in specs if any(axis is not None for axis in spec))
    return f'{sharded} of {len(specs)} parameter tensors sharded'


_active: list = []  # the sharding of (B, T, C) activations while a step is traced


def time_split_sharding(mesh: Mesh) -> NamedSharding:
    """(B, T, C): B over the batch axes, T over tensor (within each context slice, with
    context parallelism: T over context × tensor), C whole."""
    time = (CONTEXT, 'tensor') if CONTEXT in mesh.shape else 'tensor'
    return NamedSharding(mesh, P(BATCH_AXES, time, None))


@contextlib.contextmanager
def activations_split(sharding: NamedSharding | None):
    """While tracing under this, split_over_time constrains to `sharding` (None: no-op)."""
    _active.append(sharding)
    try:
        yield
    finally:
        _active.pop()


def split_over_time(x_BxTxC):
    sharding = _active[-1] if _active else None
    if sharding is None:
        return x_BxTxC
    return jax.lax.with_sharding_constraint(x_BxTxC, sharding)
