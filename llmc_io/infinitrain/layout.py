"""InfiniTrain's module tree for its GPT-2 and LLaMA-3 examples, rebuilt to derive two orders from upstream:

* `state_dict_order(family, L)`: the entry order of Module::StateDict() (what SaveStateDict writes);
* `parameter_order(family, L)`: Module::Parameters(), whose position i is HEAD's Adam key `adam.m.{i}`.

Both are std::unordered_map traversals (libcxx_order.py), so they depend on which keys were inserted
into which map in which order. That sequence is taken from InfiniTensor/InfiniTrain b24d92f (the same in
f9cb65b5 for these classes):
  infini_train/src/nn/modules/transformer/transformer.cc  TransformerFirstStage/Layer/Chunk/LastStage/Model
  infini_train/src/nn/modules/transformer/causal_self_attention.cc  c_attn, c_proj, buffer "bias" (GPT-2)
  infini_train/src/nn/modules/transformer/mlp.cc  c_fc, c_fc2 (SwiGLU), gelu|silu, c_proj
  infini_train/src/nn/modules/{linear,normalization,sparse}.cc, nn/parallel/tensor_parallel.cc  weight, bias
  infini_train/src/nn/modules/container.cc  ModuleList "0".."L-1"; ModuleDict copies its map in map order
  infini_train/src/nn/modules/module.cc  StateDict (params, buffers, submodules minus "__pp*"),
      Parameters (params, then submodules, first occurrence of each tensor)
  example/{gpt2,llama3}/config.h  biases / tie_weights / attention type
Valid for one rank with TP = PP = 1 on CPU (Module::To(cpu) returns early there; on CUDA it rebuilds the
maps, which can change the order). The index -> name table this yields for head-llama3 equals the one
../shared/infinitrain/head-llama3/adam_map.txt measured from real files.
"""

from __future__ import annotations

import functools

from llmc_io.infinitrain.libcxx_order import LibcxxStringMap

GPT2 = "gpt2"
LLAMA3 = "llama3"


class _Tensor:
    """A tensor's identity: Parameters() de-duplicates by pointer."""


class _Module:
    def __init__(self):
        self.parameters = LibcxxStringMap()
        self.buffers = LibcxxStringMap()
        self.modules = LibcxxStringMap()
        self.param_of: dict[str, _Tensor] = {}
        self.buffer_of: dict[str, _Tensor] = {}
        self.module_of: dict[str, _Module] = {}

    def add_param(self, name: str) -> None:
        self.parameters.insert(name)
        self.param_of[name] = _Tensor()

    def add_buffer(self, name: str) -> None:
        self.buffers.insert(name)
        self.buffer_of[name] = _Tensor()

    def add_module(self, name: str, module: _Module) -> None:
        self.modules.insert(name)
        self.module_of[name] = module

    def state_dict(self) -> LibcxxStringMap:
        """Module::StateDict(): a fresh map, emplaced in the traversal order; values in `self._sd_values`."""
        out = LibcxxStringMap()
        values: dict[str, _Tensor] = {}
        for name in self.parameters.keys():
            out.insert(name)
            values.setdefault(name, self.param_of[name])
        for name in self.buffers.keys():
            out.insert(name)
            values.setdefault(name, self.buffer_of[name])
        for name in self.modules.keys():
            if name.startswith("__pp"):
                continue
            sub = self.module_of[name]
            sub_map = sub.state_dict()
            for sub_name in sub_map.keys():
                full = f"{name}.{sub_name}"
                out.insert(full)
                values.setdefault(full, sub._sd_values[sub_name])
        self._sd_values = values
        return out

    def named_parameters(self) -> list[tuple[str, _Tensor]]:
        """Module::Parameters() / NamedParameters() (f9cb65b5 module.cc): own params, then each submodule's,
        recursively, in map order, each tensor once under the first name it is reached by."""
        seen: set[int] = set()
        out: list[tuple[str, _Tensor]] = []
        for name in self.parameters.keys():
            t = self.param_of[name]
            if id(t) not in seen:
                seen.add(id(t))
                out.append((name, t))
        for name in self.modules.keys():
            for sub_name, t in self.module_of[name].named_parameters():
                if id(t) not in seen:
                    seen.add(id(t))
                    out.append((f"{name}.{sub_name}", t))
        return out


def _linear(bias: bool) -> _Module:
    m = _Module()
    m.add_param("weight")
    if bias:
        m.add_param("bias")
    return m


def _norm(family: str) -> _Module:
    m = _Module()
    m.add_param("weight")
    if family == GPT2:  # LayerNorm: weight then bias; RMSNorm: weight only
        m.add_param("bias")
    return m


def _layer(family: str) -> _Module:
    bias = family == GPT2
    layer = _Module()
    layer.add_module("ln_1", _norm(family))
    layer.add_module("ln_2", _norm(family))
    attn = _Module()
    attn.add_module("c_attn", _linear(bias))
    attn.add_module("c_proj", _linear(bias))
    if family == GPT2:
        attn.add_buffer("bias")  # the (1, 1, T, T) causal mask
    layer.add_module("attn", attn)
    mlp = _Module()
    mlp.add_module("c_fc", _linear(bias))
    if family == LLAMA3:
        mlp.add_module("c_fc2", _linear(bias))
    mlp.add_module("gelu" if family == GPT2 else "silu", _Module())
    mlp.add_module("c_proj", _linear(bias))
    layer.add_module("mlp", mlp)
    return layer


def _model(
    family: str,
    num_layers: int,
    chunk_layers: tuple[int, ...] | None = None,
    first: bool = True,
    last: bool = True,
    tie: bool = True,
) -> _Module:
    """TransformerModel as one rank builds it. Defaults: one stage with every layer (PP = 1).

    A pipeline stage (transformer.cc TransformerModel::TransformerModel) has `__pp_first_stage` only on the
    first stage, one `__pp_chunk_{c}` per virtual chunk it owns with `chunk_layers[c]` layers, and
    `__pp_last_stage` plus `lm_head` only on the last; its `transformer.h` lists the stage's layers with local
    indices 0..n-1. GPT-2's wte/lm_head tie is applied only when PP == 1 (`tie`).
    """
    chunk_layers = (num_layers,) if chunk_layers is None else chunk_layers
    model = _Module()
    transformer = LibcxxStringMap()
    transformer_of: dict[str, _Module] = {}

    if first:
        stage = _Module()
        stage.add_module("wte", _linear(False))  # VocabParallelEmbedding: "weight"
        if family == GPT2:
            stage.add_module("wpe", _linear(False))  # Embedding: "weight"
        model.add_module("__pp_first_stage", stage)
        for name in ("wte", "wpe") if family == GPT2 else ("wte",):
            transformer.insert(name)
            transformer_of[name] = stage.module_of[name]

    h = _Module()  # TransformerModel's own ModuleList over its chunks' layers
    for c, count in enumerate(chunk_layers):
        chunk = _Module()
        layers = _Module()  # ModuleList
        for i in range(count):
            layers.add_module(str(i), _layer(family))
            h.add_module(str(len(h.module_of)), layers.module_of[str(i)])
        chunk.add_module("h", layers)
        model.add_module(f"__pp_chunk_{c}", chunk)
    transformer.insert("h")
    transformer_of["h"] = h

    if last:
        stage = _Module()
        stage.add_module("ln_f", _norm(family))
        stage.add_module("lm_head", _linear(False))  # add_bias_lm_head is false in both configs
        model.add_module("__pp_last_stage", stage)
        transformer.insert("ln_f")
        transformer_of["ln_f"] = stage.module_of["ln_f"]
        model.add_module("lm_head", stage.module_of["lm_head"])

    module_dict = _Module()
    for name in transformer.keys():
        module_dict.add_module(name, transformer_of[name])
    model.add_module("transformer", module_dict)

    if family == GPT2 and tie and first and last:  # tie_weights: wte's weight pointer becomes lm_head's
        first_stage, last_stage = model.module_of["__pp_first_stage"], model.module_of["__pp_last_stage"]
        first_stage.module_of["wte"].param_of["weight"] = last_stage.module_of["lm_head"].param_of["weight"]
    return model


def _to_accelerator(module: _Module, seen: set[int]) -> None:
    """Module::To(Device) for a device other than the CPU (module.cc): each module, once, rebuilds its
    parameter and buffer maps by emplacing the old ones in their iteration order, with new tensors (which
    also unties GPT-2's wte / lm_head), then recurses into its submodules."""
    if id(module) in seen:
        return
    seen.add(id(module))
    module.parameters = LibcxxStringMap(module.parameters.keys())
    module.param_of = {name: _Tensor() for name in module.param_of}
    module.buffers = LibcxxStringMap(module.buffers.keys())
    module.buffer_of = {name: _Tensor() for name in module.buffer_of}
    for name in module.modules.keys():
        _to_accelerator(module.module_of[name], seen)


@functools.lru_cache(maxsize=64)
def _orders(family: str, num_layers: int, device: str = "cpu") -> tuple[tuple[str, ...], tuple[str, ...]]:
    if family not in (GPT2, LLAMA3):
        raise ValueError(f"unknown model family {family!r}")
    model = _model(family, num_layers)
    if device != "cpu":  # main.cc calls model->To(device), a no-op on the CPU the samples ran on
        _to_accelerator(model, set())
    names = tuple(model.state_dict().keys())
    params = tuple(name for name, _ in model.named_parameters())
    unknown = [name for name in params if name not in names]
    if unknown:  # a parameter first reached through a "__pp*" module would have no StateDict name
        raise AssertionError(f"parameters without a StateDict name: {unknown}")
    return names, params


def state_dict_order(family: str, num_layers: int) -> tuple[str, ...]:
    """Module::StateDict() names in iteration (= CKPT file) order."""
    return _orders(family, num_layers)[0]


def parameter_order(family: str, num_layers: int, device: str = "cpu") -> tuple[str, ...]:
    """Module::Parameters() as StateDict names; position i is HEAD's `adam.m.{i}` / `adam.v.{i}`.

    device "cuda": after Module::To(cuda), derived from the code but not checked against a real file. For
    LLaMA-3 it equals the CPU order (each module has one parameter, so no map changes); for GPT-2 it differs
    (and the tie between wte and lm_head is broken), which jaxtrain cannot represent anyway.
    """
    return _orders(family, num_layers, device)[1]


def adam_key_order(family: str, num_layers: int, head_keys: bool) -> tuple[str, ...]:
    """The entry order of Adam::StateDict(): emplace m.i, v.i for each parameter, then adam.t.

    head_keys: HEAD's positional keys; else the PR's name keys (f9cb65b5 optimizer.cc, same emplace order).
    """
    params = parameter_order(family, num_layers)
    m = LibcxxStringMap()
    for i, name in enumerate(params):
        tag = str(i) if head_keys else name
        m.insert(f"adam.m.{tag}")
        m.insert(f"adam.v.{tag}")
    m.insert("adam.t")
    return tuple(m.keys())


def _names_by_tensor(model: _Module) -> dict[int, str]:
    """id(tensor) -> its first StateDict name (in StateDict order), so Parameters() can be named."""
    out: dict[int, str] = {}
    for name in model.state_dict().keys():
        out.setdefault(id(model._sd_values[name]), name)
    return out


@functools.lru_cache(maxsize=256)
def stage_orders(
    family: str,
    chunk_layers: tuple[int, ...],
    first: bool,
    last: bool,
    wrapped: bool,
    device: str = "cuda",
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """One rank of a parallel run: (StateDict names in file order, Module::Parameters() as unprefixed
    StateDict names, and Parameters() of each model chunk DistributedDataParallel wraps).

    The model goes to the device before any wrapper (example/gpt2/main.cc:223 model->To(device)), and
    a parallel run is always on CUDA (main.cc:173), so `device` defaults to "cuda" (see parameter_order).
    `wrapped`: DDP or PipelineParallel holds the model as "module" (a StateDict of its own, re-emplaced).
    The chunks: without PP, DDP wraps the whole model; with PP each chunk is a Sequential of the first stage
    (chunk 0 of stage 0), `__pp_chunk_{c}` and the last stage (last chunk of the last stage), named "0".."2"
    (pp/pipeline_parallel.cc:88-99, container.cc:10-16), each wrapped on its own (main.cc:281-288).
    """
    tie = first and last  # PP == 1 exactly when one stage is both (transformer.cc:256)
    model = _model(family, sum(chunk_layers), chunk_layers, first, last, tie)
    if device != "cpu":
        _to_accelerator(model, set())
    names = _names_by_tensor(model)
    params = tuple(names[id(t)] for _, t in model.named_parameters())
    top = model
    if wrapped:
        top = _Module()
        top.add_module("module", model)
    state_names = tuple(top.state_dict().keys())
    if first and last:
        chunks = (params,)
    else:
        chunks = []
        for c in range(len(chunk_layers)):
            parts = []
            if c == 0 and first:
                parts.append(model.module_of["__pp_first_stage"])
            parts.append(model.module_of[f"__pp_chunk_{c}"])
            if c == len(chunk_layers) - 1 and last:
                parts.append(model.module_of["__pp_last_stage"])
            sequential = _Module()
            for i, part in enumerate(parts):
                sequential.add_module(str(i), part)
            chunks.append(tuple(names[id(t)] for _, t in sequential.named_parameters()))
        chunks = tuple(chunks)
    return state_names, params, chunks
