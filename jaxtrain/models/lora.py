"""LoRA adapters on the projections of either model family, as InfiniTrain defines them.

Following InfiniTrain (commit b24d92f, infini_train/src/nn/lora/): a targeted Linear
computes y = Wx + b + (α/r)·x·Aᵀ·Bᵀ with A (r, in) and B (out, r); A starts Kaiming-uniform
(a = √5, fan_in: bound 1/√in), B at zero, so step 0 is the base model exactly. The base
weights are frozen: the trainer differentiates the LoRA tree only (train/setup.py).

Targets match module names by suffix, as LoRAConfig::ShouldApplyLoRA does, against
InfiniTrain's names `transformer.h.{i}.attn.c_attn` and so on: `c_proj` therefore means
both attn.c_proj and mlp.c_proj, `mlp.c_proj` only the MLP's. Unlike InfiniTrain, a target
that matches no projection is refused rather than ignored.

Trees: the LoRA parameters are a pure dict shaped like the base tree, stacked over L:
  h/attn/c_attn/lora_A  (L, r, in)     h/attn/c_attn/lora_B  (L, out, r)
and the base tree (llmc_io/PARAMS_SPEC.md) is unchanged: LoRALinear is an nnx.Linear with
two more variables, of their own type (LoRAParam), so `nnx.Param` still selects the base.

Giving a model setup its LoRA adapters (attach_lora), and moving them to and from
InfiniTrain's LoRA weights file (llmc_io/infinitrain/lora_weights.py).

InfiniTrain names a tensor by its module path: `transformer.h.{i}.attn.c_attn.lora_A` is
layer i's A of attention's c_attn, shaped (r, in) as ours; our tree stacks the L layers.
Our arrays are the logical (whole) tensors on any mesh, which is what PR 150's writer
gathers its TP shards into: c_attn's B rows are [Q | K | V] as in the base kernel, so a file
from any TP size loads on any mesh, and ours is the one a TP 1 run would write.
"""

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.lora_weights import (
    ordered_for_layout,
    read_lora_weights,
    without_ddp_prefix,
    write_lora_weights,
)

# Every projection a block has, in InfiniTrain's names (gpt2 lacks c_fc2).
PROJECTIONS = ('attn.c_attn', 'attn.c_proj', 'mlp.c_fc', 'mlp.c_fc2', 'mlp.c_proj')
KAIMING_A = np.float32(math.sqrt(5.0))  # LoRAConfig::kaiming_a_param
INIT_SALT = 0x4C4F5241  # 'LORA': the LoRA init draws from its own stream, not the model's


class LoRAParam(nnx.Variable):
    """A trainable LoRA matrix: kept apart from nnx.Param, which are the frozen base."""


@dataclasses.dataclass(frozen=True)
class LoRASpec:
    rank: int
    alpha: float
    targets: tuple[str, ...]  # as given, e.g. ('c_attn', 'c_proj')
    modules: tuple[str, ...]  # the projections they select, e.g. ('attn.c_attn', 'attn.c_proj', 'mlp.c_proj')

    @property
    def scale(self) -> float:
        """α/r in fp32, as LoRAConfig::Scaling computes it."""
        return float(np.float32(self.alpha) / np.float32(self.rank))

    def record(self) -> dict:
        return {
            'rank': self.rank,
            'alpha': self.alpha,
            'targets': list(self.targets),
            'modules': list(self.modules),
        }


def parse_targets(text: str) -> tuple[str, ...]:
    """ParseLoRATargetModules: split on commas, trim, drop empties (kept in order, unique)."""
    seen = []
    for part in text.split(','):
        part = part.strip()
        if part and part not in seen:
            seen.append(part)
    return tuple(seen)


def _matches(target: str, module_name: str) -> bool:
    """ShouldApplyLoRA: module_name ends with target, at a '.' boundary or whole."""
    return module_name == target or module_name.endswith('.' + target)


def projection_shapes(base_params: dict) -> dict[str, tuple[int, int]]:
    """{'attn.c_attn': (in, out), ...} for the projections this model has."""
    shapes = {}
    for module in PROJECTIONS:
        group, name = module.split('.')
        kernel = base_params.get('h', {}).get(group, {}).get(name, {}).get('kernel')
        if kernel is not None:
            shapes[module] = (int(kernel.shape[-2]), int(kernel.shape[-1]))
    return shapes


def resolve_spec(config, base_params: dict, family: str) -> LoRASpec | None:
    """The LoRASpec of config.lora_* for this model, or None when lora_rank is 0; a bad
    rank or target is one line naming the flag."""
    rank = config.lora_rank
    if rank == 0:
        for key in ('lora_load_path', 'lora_save_path'):
            if config[key]:
                raise ValueError(
                    f'{key}: expected --lora_rank > 0 with a LoRA weights file, found lora_rank 0'
                )
        return None
    if rank < 0:
        raise ValueError(f'lora_rank: expected 0 (off) or a positive rank, found {rank}')
    if not config.lora_alpha > 0:
        raise ValueError(f'lora_alpha: expected a positive scaling factor, found {config.lora_alpha}')
    shapes = projection_shapes(base_params)
    targets = parse_targets(config.lora_target_modules)
    if not targets:
        raise ValueError(
            f'lora_target_modules: expected comma-separated projection names ({", ".join(shapes)}), '
            f'found {config.lora_target_modules!r}'
        )
    num_layers = int(base_params['h']['ln_1']['scale'].shape[0])
    selected = set()
    for target in targets:
        # Matched against every layer's full name, as InfiniTrain walks its modules.
        hits = {
            module
            for module in shapes
            for layer in range(num_layers)
            if _matches(target, f'transformer.h.{layer}.{module}')
        }
        partial = [
            m for m in hits if not all(_matches(target, f'transformer.h.{i}.{m}') for i in range(num_layers))
        ]
        if partial:
            raise ValueError(
                f'lora_target_modules: {target!r} selects {partial[0]} in some layers only; expected a '
                'name every layer shares (per-layer targets are not supported)'
            )
        if not hits:
            raise ValueError(
                f'lora_target_modules: {target!r} matches no projection of the {family} model; expected '
                f'names ending one of {", ".join(shapes)} (c_proj selects attn.c_proj and mlp.c_proj)'
            )
        selected |= hits
    modules = tuple(m for m in PROJECTIONS if m in selected)
    for module in modules:
        n_in, n_out = shapes[module]
        if rank > min(n_in, n_out):
            raise ValueError(
                f'lora_rank: expected at most {min(n_in, n_out)} (the narrower side of {module}, '
                f'{n_in} -> {n_out}), found {rank}; pass a smaller --lora_rank'
            )
    return LoRASpec(rank, float(config.lora_alpha), targets, modules)


class LoRALinear(nnx.Linear):
    """nnx.Linear plus the low-rank update; kernel and bias keep their names and paths."""

    def __init__(self, in_features: int, out_features: int, *, rank: int, scale: float, **linear_options):
        super().__init__(in_features, out_features, **linear_options)
        # Zeros here so that building the model draws nothing from its rngs (the base init of a
        # LoRA run equals the plain run's); init_lora_params gives A its values.
        self.lora_A = LoRAParam(jnp.zeros((rank, in_features), jnp.float32))
        self.lora_B = LoRAParam(jnp.zeros((out_features, rank), jnp.float32))
        self.lora_scale = scale

    def __call__(self, x):
        y = super().__call__(x)
        dtype = self.dtype or x.dtype
        a, b = self.lora_A[...].astype(dtype), self.lora_B[...].astype(dtype)
        update = jnp.einsum('...r,or->...o', jnp.einsum('...i,ri->...r', x.astype(dtype), a), b)
        return y + (self.lora_scale * update).astype(y.dtype)


def linear(lora: LoRASpec | None, module: str, in_features: int, out_features: int, **options):
    """The model families' projections: an nnx.Linear, or a LoRALinear where `lora` targets
    `module` (e.g. 'attn.c_attn')."""
    if lora is None or module not in lora.modules:
        return nnx.Linear(in_features, out_features, **options)
    return LoRALinear(in_features, out_features, rank=lora.rank, scale=lora.scale, **options)


def kaiming_uniform_bound(fan_in: int) -> np.float32:
    """init::KaimingUniform with a = √5, leaky-ReLU gain, fan_in mode: √3·gain/√fan_in."""
    gain = np.sqrt(np.float32(2.0) / (np.float32(1.0) + KAIMING_A * KAIMING_A))
    return np.float32(np.sqrt(np.float32(3.0)) * (gain / np.sqrt(np.float32(fan_in))))


def init_lora_params(abstract_lora: dict, seed: int) -> dict:
    """A uniform in ±1/√in, B zero, for the pure-dict tree of LoRAParam shapes."""
    root = jax.random.fold_in(jax.random.PRNGKey(seed), INIT_SALT)
    flat = jax.tree_util.tree_flatten_with_path(abstract_lora)[0]
    values = []
    for index, (path, leaf) in enumerate(flat):
        if path[-1].key == 'lora_A':
            bound = kaiming_uniform_bound(leaf.shape[-1])
            key = jax.random.fold_in(root, index)
            values.append(jax.random.uniform(key, leaf.shape, jnp.float32, -bound, bound))
        else:
            values.append(jnp.zeros(leaf.shape, jnp.float32))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(abstract_lora), values)


def count_parameters(lora_params: dict) -> int:
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(lora_params)))


def merged_params(base_params: dict, lora_params: dict, spec_record: dict) -> dict:
    """The base tree with W + (α/r)·B·A folded into every adapted kernel (NumPy, fp32).

    Our kernels are (in, out), the transpose of InfiniTrain's W, so the fold adds
    (α/r)·(B·A)ᵀ = (α/r)·Aᵀ·Bᵀ per layer. Everything else (the tied wte head included) is
    copied untouched."""
    scale = np.float32(np.float32(spec_record['alpha']) / np.float32(spec_record['rank']))
    merged = jax.tree.map(lambda x: np.array(x, np.float32), base_params)
    for module in spec_record['modules']:
        group, name = module.split('.')
        a = np.asarray(lora_params['h'][group][name]['lora_A'], np.float32)  # (L, r, in)
        b = np.asarray(lora_params['h'][group][name]['lora_B'], np.float32)  # (L, out, r)
        delta = np.einsum('lri,lor->lio', a, b)  # (L, in, out) = (B·A)ᵀ per layer
        kernel = merged['h'][group][name]['kernel']
        merged['h'][group][name]['kernel'] = (kernel + scale * delta).astype(np.float32)
    return merged


def describe(spec: LoRASpec, lora_params: dict, base_parameters: int) -> str:
    """The start-up line of a LoRA run."""
    count = count_parameters(lora_params)
    return (
        f'lora: rank {spec.rank}, alpha {spec.alpha:g} (scale {spec.scale:g}) on {", ".join(spec.modules)} | '
        f'{count:,} trainable parameters ({100 * count / base_parameters:.3f}% of the frozen '
        f'{base_parameters:,})'
    )


_UPSTREAM_NAME = re.compile(r'^transformer\.h\.(\d+)\.(\w+)\.(\w+)\.(lora_A|lora_B)$')


def attach_lora(config, setup, model_cls, options: dict):
    """`setup` with adapters when config.lora_rank > 0 (else unchanged): the graphdef of the
    model with LoRALinear on the targets, the initial (or loaded) LoRA tree, and the spec."""
    spec = resolve_spec(config, setup.params, config.model_family)
    if spec is None:
        return setup
    abstract = nnx.eval_shape(lambda: model_cls(setup.model_config, **options, lora=spec, rngs=nnx.Rngs(0)))
    graphdef, _, abstract_lora = nnx.split(abstract, nnx.Param, LoRAParam)
    lora_params = init_lora_params(nnx.to_pure_dict(abstract_lora), config.seed)
    source = setup.source
    if config.lora_load_path:
        lora_params = load_upstream_lora(config.lora_load_path, lora_params, spec)
        source += f' + LoRA weights {config.lora_load_path}'
    return dataclasses.replace(setup, graphdef=graphdef, lora=spec, lora_params=lora_params, source=source)


def upstream_tensors(lora_params: dict) -> list[tuple[str, np.ndarray]]:
    """(InfiniTrain name, array) for every layer's A and B, by layer then module (the order
    the head layout writes; b24d92f's own is an unordered_map's, which no reader relies on)."""
    rows = []
    for group, modules in lora_params['h'].items():
        for name, pair in modules.items():
            for which in ('lora_A', 'lora_B'):
                stacked = np.asarray(jax.device_get(pair[which]), np.float32)
                rows += [
                    (f'transformer.h.{i}.{group}.{name}.{which}', stacked[i]) for i in range(len(stacked))
                ]
    layer_of = lambda row: int(row[0].split('.')[2])
    return sorted(rows, key=lambda row: (layer_of(row), row[0]))


def load_upstream_lora(path: str, like: dict, spec) -> dict:
    """The LoRA tree of `like`'s structure from the file; anything that does not fit the
    model or the targets (a name, a rank, a shape) is one line naming the file and flag."""
    expected = dict(upstream_tensors(like))
    try:
        found = read_lora_weights(path)
    except LLMCFormatError as e:
        raise ValueError(f'lora_load_path: {e}') from None
    found = [(without_ddp_prefix(name, expected), array) for name, array in found]
    names = [name for name, _ in found]
    problems = []
    for name in names:
        if name not in expected:
            match = _UPSTREAM_NAME.match(name)
            module = f'{match.group(2)}.{match.group(3)}' if match else ''
            if module in PROJECTIONS and module not in spec.modules:
                problems.append(
                    f'{name}: adapts {module}, which lora_target_modules {",".join(spec.targets)} does not '
                    f'select (it selects {", ".join(spec.modules)})'
                )
            else:
                problems.append(f'{name}: not a LoRA tensor of this model')
    missing = [name for name in expected if name not in names]
    if missing:
        problems.append(f'{len(missing)} tensor(s) of this model missing, e.g. {missing[0]}')
    for name, array in found:
        if name in expected and array.shape != expected[name].shape:
            problems.append(
                f'{name}: expected shape {expected[name].shape} (rank {spec.rank}), found {array.shape}'
            )
    if len(set(names)) != len(names):
        problems.append('a tensor name appears twice')
    if problems:
        raise ValueError(
            f'lora_load_path: {path}: does not fit this model and its LoRA targets: {problems[0]}'
            + (f' (and {len(problems) - 1} more problem(s))' if len(problems) > 1 else '')
            + '; pass the --lora_rank and --lora_target_modules it was trained with, and its base model'
        )
    values = dict(found)

    def stacked(path, leaf):
        group, name, which = path[-3].key, path[-2].key, path[-1].key
        layers = [values[f'transformer.h.{i}.{group}.{name}.{which}'] for i in range(leaf.shape[0])]
        return np.stack(layers).astype(np.float32)

    return jax.tree_util.tree_map_with_path(stacked, like)


def save_lora_weights(path: str, lora_params: dict, layout: str = 'master') -> str:
    """--lora_save_path at the end of a run (process 0 writes) in --lora_save_layout's layout
    (llmc_io/infinitrain/lora_weights.py); returns the log line."""
    if jax.process_count() > 1:  # adapters sharded over fsdp span processes: gather them whole
        from jax.experimental import multihost_utils

        lora_params = multihost_utils.process_allgather(lora_params, tiled=True)
    tensors = ordered_for_layout(upstream_tensors(lora_params), layout)
    if jax.process_index() == 0:
        try:
            write_lora_weights(
                path, tensors
            )  # a temporary name, then a rename: the old file stays on failure
        except OSError as e:
            raise OSError(
                f'lora_save_path: {path}: could not write the adapters: {e.strerror or e}; what was there is '
                'unchanged. Free space (or fix the path) and run again'
            ) from None
    return (
        f'lora_save_path: wrote {len(tensors)} LoRA tensors to {path} '
        f"(InfiniTrain's LoRA weights format, {layout} layout)"
    )
