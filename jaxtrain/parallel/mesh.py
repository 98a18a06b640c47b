"""The device mesh a run trains on, from the config keys mesh_data, mesh_fsdp, mesh_tensor.

Axes, in this order (the slowest-varying first, so `data` spans hosts and `tensor` stays
inside one):
  data    plain data parallelism: parameters replicated, the batch split
  fsdp    fully sharded data parallelism: the batch split and parameters and optimizer
          state sharded (sharding.py)
  context (only with context_parallel C > 1, between fsdp and tensor) context parallelism:
          each sequence cut into C contiguous slices along T, one per device, as
          InfiniTrain's SliceAlongCPRegionFunc cuts it; parameters replicated over it; the
          attention crosses it (context_parallel.py). Rows are not split over it: the data
          order and the tokens of a step do not depend on C
  tensor  tensor parallelism inside the MLP and attention projections (sharding.py); the
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
"""

import math

import jax
from jax.sharding import AxisType, Mesh

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
