"""InfiniTrain StateDict names <-> the parameter trees of llmc_io/PARAMS_SPEC.md: weights and Adam moments.

Names come from upstream's module tree (InfiniTensor/InfiniTrain b24d92f, the same in f9cb65b5):
`transformer.{wte,wpe}.weight`, `transformer.h.{i}.{ln_1,ln_2}.{weight,bias}`,
`transformer.h.{i}.attn.{c_attn,c_proj}.{weight,bias}`,
`transformer.h.{i}.mlp.{c_fc,c_fc2,c_proj}.weight[/bias]`,
`transformer.ln_f.{weight,bias}`, `lm_head.weight`; GPT-2 also stores the causal-mask buffer
`transformer.h.{i}.attn.bias` (1, 1, T, T) = tril(ones). Linear weights are (out, in); tree kernels (in, out).

GPT-2 (tie_weights): `lm_head.weight` and `transformer.wte.weight` are one tensor, stored twice. Upstream has
V rows at TP=1 (example/gpt2/checkpoint_loader.cc skips the Vp-V padding rows), our tree Vp: reading pads
with zeros, writing drops rows V..Vp-1.
A tied LLaMA (a tree without lm_head: Llama-3.2-1B, 3B) has no such tie upstream, whose LLaMA-3 has its own
`lm_head.weight`: the one tensor (and its Adam moments) is written twice, as GPT-2's is, and read back into
a tied tree only where both copies are equal.
Adam keys: HEAD `adam.m.{i}` / `adam.v.{i}` with i the position in Module::Parameters()
(llmc_io/infinitrain/layout.py derives it), PR f9cb65b5 `adam.m.<NamedParameters name>`; both have `adam.t`,
int64, 0-d.
"""

from __future__ import annotations

import concurrent.futures
import os
import re

import numpy as np

from llmc_io.infinitrain import layout
from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.statedict import KFLOAT32, KINT64, CkptTensor
from llmc_io.tensors import FileLeaf, LeafEntry, tree_leaves, tree_set

GPT2, LLAMA3 = layout.GPT2, layout.LLAMA3

# (upstream name under transformer.h.{i}., tree path, is a (out, in) linear weight)
_LAYER = {
    GPT2: (
        ("ln_1.weight", "h/ln_1/scale", False),
        ("ln_1.bias", "h/ln_1/bias", False),
        ("attn.c_attn.weight", "h/attn/c_attn/kernel", True),
        ("attn.c_attn.bias", "h/attn/c_attn/bias", False),
        ("attn.c_proj.weight", "h/attn/c_proj/kernel", True),
        ("attn.c_proj.bias", "h/attn/c_proj/bias", False),
        ("ln_2.weight", "h/ln_2/scale", False),
        ("ln_2.bias", "h/ln_2/bias", False),
        ("mlp.c_fc.weight", "h/mlp/c_fc/kernel", True),
        ("mlp.c_fc.bias", "h/mlp/c_fc/bias", False),
        ("mlp.c_proj.weight", "h/mlp/c_proj/kernel", True),
        ("mlp.c_proj.bias", "h/mlp/c_proj/bias", False),
    ),
    LLAMA3: (
        ("ln_1.weight", "h/ln_1/scale", False),
        ("attn.c_attn.weight", "h/attn/c_attn/kernel", True),
        ("attn.c_proj.weight", "h/attn/c_proj/kernel", True),
        ("ln_2.weight", "h/ln_2/scale", False),
        ("mlp.c_fc.weight", "h/mlp/c_fc/kernel", True),
        ("mlp.c_fc2.weight", "h/mlp/c_fc2/kernel", True),
        ("mlp.c_proj.weight", "h/mlp/c_proj/kernel", True),
    ),
}
# (upstream name, tree path, transposed)
_GLOBAL = {
    GPT2: (
        ("transformer.wte.weight", "wte/embedding", False),
        ("transformer.wpe.weight", "wpe/embedding", False),
        ("transformer.ln_f.weight", "ln_f/scale", False),
        ("transformer.ln_f.bias", "ln_f/bias", False),
    ),
    LLAMA3: (
        ("transformer.wte.weight", "wte/embedding", False),
        ("transformer.ln_f.weight", "ln_f/scale", False),
        ("lm_head.weight", "lm_head/kernel", True),
    ),
}
TIED_HEAD = "lm_head.weight"  # GPT-2: a second copy of transformer.wte.weight
_MASK = re.compile(r"^transformer\.h\.(\d+)\.attn\.bias$")
_LAYER_NAME = re.compile(r"^transformer\.h\.(\d+)\.")


def family_of(names) -> str:
    """gpt2 when the state dict has a position embedding (LLaMA-3 uses RoPE), else llama3."""
    return GPT2 if "transformer.wpe.weight" in names else LLAMA3


def num_layers_of(names) -> int:
    layers = {int(m.group(1)) for n in names if (m := _LAYER_NAME.match(n))}
    return max(layers) + 1 if layers else 0


def name_to_path(family: str, num_layers: int) -> dict[str, tuple[str, int | None, bool]]:
    """{upstream parameter name: (tree path, layer index or None, transposed)} (no buffers, no tied copy)."""
    table: dict[str, tuple[str, int | None, bool]] = {}
    for name, path, transposed in _GLOBAL[family]:
        table[name] = (path, None, transposed)
    for i in range(num_layers):
        for suffix, path, transposed in _LAYER[family]:
            table[f"transformer.h.{i}.{suffix}"] = (path, i, transposed)
    return table


def causal_mask(block_size: int) -> np.ndarray:
    """The (1, 1, T, T) fp32 lower-triangular ones GPT-2's CausalSelfAttention registers as buffer 'bias'."""
    return np.tril(np.ones((block_size, block_size), np.float32)).reshape(1, 1, block_size, block_size)


def _leaf(array, layer: int | None, transposed: bool):
    """A view, not a copy: the writer makes each tensor contiguous a slice at a time
    (statedict.state_dict_pieces), so a save never holds a second copy of the model. A leaf not
    on the host (a device array) becomes a LeafEntry, fetched layer by layer as it is written."""
    if not isinstance(array, np.ndarray):
        return LeafEntry(array, layer, transposed)
    value = np.asarray(array, dtype=np.float32)
    value = value if layer is None else value[layer]
    return np.swapaxes(value, -1, -2) if transposed else value


def _first_rows(value, rows: int):
    return value.first_rows(rows) if isinstance(value, LeafEntry) else value[:rows]


def tree_to_state_dict(family: str, params: dict, vocab_size: int, block_size: int) -> dict[str, CkptTensor]:
    """Our tree -> upstream StateDict entries in libc++ StateDict order (what the real binary writes)."""
    leaves = _with_tied_head(family, _host_or_deferred(params))
    num_layers = leaves["h/ln_1/scale"].shape[0]
    values: dict[str, np.ndarray] = {}
    for name, (path, layer, transposed) in name_to_path(family, num_layers).items():
        values[name] = _leaf(leaves[path], layer, transposed)
    values["transformer.wte.weight"] = _first_rows(values["transformer.wte.weight"], vocab_size)
    if family == GPT2:
        values[TIED_HEAD] = values["transformer.wte.weight"]
        for i in range(num_layers):
            values[f"transformer.h.{i}.attn.bias"] = causal_mask(block_size)
    order = layout.state_dict_order(family, num_layers)
    return {name: CkptTensor(KFLOAT32, values[name]) for name in order}


def _host_or_deferred(tree: dict) -> dict:
    """{tree path: leaf}: NumPy leaves as fp32 arrays, any other (a device array) left where it is
    for the writer to fetch an entry at a time (LeafEntry)."""
    return {
        k: np.asarray(v, dtype=np.float32) if isinstance(v, np.ndarray) or np.isscalar(v) else v
        for k, v in tree_leaves(tree).items()
    }


def _with_tied_head(family: str, leaves: dict) -> dict:
    """A tied LLaMA's leaves with the head upstream stores: wte as lm_head's (C, V) kernel (a view;
    for a leaf not on the host, the same entry as wte's, transposed twice)."""
    if family == LLAMA3 and "lm_head/kernel" not in leaves:
        wte = leaves["wte/embedding"]
        head = wte.T if isinstance(wte, np.ndarray) else _Transposed(wte)
        return {**leaves, "lm_head/kernel": head}
    return leaves


class _Transposed:
    """A device leaf's transpose, taken when fetched: lm_head's kernel of a tied LLaMA."""

    def __init__(self, leaf):
        self.leaf, self.shape = leaf, tuple(leaf.shape)[::-1]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self.leaf, dtype=dtype).T


def _same_bits(a, b) -> bool:
    """Whether two fp32 arrays hold the same bytes, compared where they are (NumPy's, or a device's
    array placed by read_state_dict), never copied to the host."""
    return tuple(a.shape) == tuple(b.shape) and bool((a.view(np.uint32) == b.view(np.uint32)).all())


def _fail(path, field, expected, found, hint=None):
    raise LLMCFormatError(path, field, expected, found, hint)


def state_dict_to_tree(
    path,
    tensors: dict,
    expected_shapes: dict[str, tuple[int, ...]],
    consume: bool = False,
    assemble: bool = True,
) -> dict:
    """Upstream model StateDict -> our tree, checked against the tree shapes our model expects.
    consume: each layer's entry is removed from `tensors` once its stacked leaf is made, so that
    the file's arrays and the tree's are never all in memory at once. assemble=False leaves each
    stacked or transposed leaf a FileLeaf of the file's arrays, for the caller to make where it
    is cheaper (a restore: on the device).

    `expected_shapes` is {tree path: shape} of the model being resumed (its family, L, Vp come from it).
    Every name must fit: a missing, unexpected or mis-shaped tensor is one LLMCFormatError naming it.
    """
    names = list(tensors)
    family = GPT2 if "wpe/embedding" in expected_shapes else LLAMA3
    num_layers = expected_shapes["h/ln_1/scale"][0]
    tied_llama = family == LLAMA3 and "lm_head/kernel" not in expected_shapes
    if tied_llama:  # the head is read as the tree's lm_head would be, then checked against wte
        V, C = expected_shapes["wte/embedding"]
        expected_shapes = {**expected_shapes, "lm_head/kernel": (C, V)}
    if family_of(names) != family:
        _fail(path, "model family", family, family_of(names), "the checkpoint is for another model")
    table = name_to_path(family, num_layers)
    wanted = set(table)
    if family == GPT2:
        wanted |= {TIED_HEAD} | {f"transformer.h.{i}.attn.bias" for i in range(num_layers)}
    for name in names:
        if name not in wanted:
            _fail(
                path,
                f"tensor '{name}'",
                f"a name of this {family} model with {num_layers} layers",
                "a name that does not fit it",
                "was the checkpoint written for another model shape?",
            )
    for name in sorted(wanted - set(names)):
        _fail(path, f"tensor '{name}'", "present", "missing")
    arrays = {n: (t.array if isinstance(t, CkptTensor) else np.asarray(t)) for n, t in tensors.items()}
    for n, t in tensors.items():
        code = t.dtype if isinstance(t, CkptTensor) else None
        if code is not None and code != KFLOAT32:
            _fail(path, f"tensor '{n}' dtype", "11 (kFLOAT32)", str(code))
    per_layer: dict[str, list] = {}
    layer_names: dict[str, list] = {}
    layer_transposed: dict[str, bool] = {}
    tree: dict = {}
    for name, (tree_path, layer, transposed) in table.items():
        value = arrays[name]
        shape = expected_shapes[tree_path]
        leaf_shape = shape[1:] if layer is not None else shape
        if transposed:
            leaf_shape = leaf_shape[:-2] + (leaf_shape[-1], leaf_shape[-2])
        if (
            name == "transformer.wte.weight"
            and value.ndim == 2
            and value.shape[1] == leaf_shape[1]
            and value.shape[0] < leaf_shape[0]
        ):
            # TP=1 upstream keeps V rows; our table has Vp: the padding rows are zeros.
            value = np.concatenate(
                [value, np.zeros((leaf_shape[0] - value.shape[0], value.shape[1]), value.dtype)]
            )
        if tuple(value.shape) != tuple(leaf_shape):
            _fail(path, f"tensor '{name}' shape", f"{tuple(leaf_shape)}", f"{tuple(value.shape)}")
        if layer is None:
            leaf = FileLeaf([value], stacked=False, transposed=transposed)
            tree_set(tree, tree_path, leaf.assemble() if assemble else leaf)
        else:
            per_layer.setdefault(tree_path, [None] * num_layers)[layer] = value
            layer_names.setdefault(tree_path, []).append(name)
            layer_transposed[tree_path] = transposed
    # Each stacked leaf is a copy of its layers (transposed where the file is (out, in)); NumPy's
    # copies let go of the GIL, so the leaves are made side by side.
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:

        def stack(tree_path: str) -> np.ndarray:
            value = FileLeaf(per_layer[tree_path], stacked=True, transposed=layer_transposed[tree_path])
            if assemble:
                value = value.assemble()
            if consume:  # the layers' file arrays go as soon as their copy is made
                per_layer[tree_path] = None
                for name in layer_names[tree_path]:
                    tensors.pop(name, None)
                    arrays.pop(name, None)
            return value

        stacked = pool.map(stack, list(per_layer))
        for tree_path, value in zip(list(per_layer), stacked):
            tree_set(tree, tree_path, value)
    if family == GPT2:
        wte = arrays["transformer.wte.weight"]
        if not _same_bits(arrays[TIED_HEAD], wte):
            _fail(
                path,
                f"tensor '{TIED_HEAD}'",
                "the same bytes as transformer.wte.weight (GPT-2 ties them)",
                "different values",
                "this file was not written by InfiniTrain's GPT-2",
            )
        block = expected_shapes["wpe/embedding"][0]
        for i in range(num_layers):
            name = f"transformer.h.{i}.attn.bias"
            if arrays[name].shape != (1, 1, block, block):
                _fail(path, f"tensor '{name}' shape", f"(1, 1, {block}, {block})", f"{arrays[name].shape}")
    if tied_llama:
        head = tree.pop("lm_head")["kernel"]
        wte = tree["wte"]["embedding"]
        rows = head.parts[0] if isinstance(head, FileLeaf) else head.T  # the file's (V, C)
        if not _same_bits(rows, wte.parts[0] if isinstance(wte, FileLeaf) else wte):
            _fail(
                path,
                f"tensor '{TIED_HEAD}'",
                "the same bytes as transformer.wte.weight (the run's LLaMA ties them)",
                "different values",
                "start from it with --init_from into an untied model instead",
            )
    return tree


# ---- Adam moments ------------------------------------------------------------------------------------------


def adam_key(kind: str, family: str, num_layers: int, name: str, head_keys: bool) -> str:
    """'adam.m.3' (HEAD) or 'adam.m.transformer.h.0.ln_1.weight' (PR) for parameter `name`."""
    if head_keys:
        return f"adam.{kind}.{layout.parameter_order(family, num_layers).index(name)}"
    return f"adam.{kind}.{name}"


def detect_head_keys(names) -> bool:
    """True for HEAD's positional keys (adam.m.0), False for the PR's name keys."""
    return any(re.fullmatch(r"adam\.[mv]\.\d+", n) for n in names)


def moments_to_trees(
    path,
    tensors: dict,
    expected_shapes: dict[str, tuple[int, ...]],
    consume: bool = False,
    assemble: bool = True,
):
    """Adam StateDict -> (mu tree, nu tree, t): moments mapped by name (HEAD: via the derived index order).
    consume, assemble: as state_dict_to_tree's."""
    family = GPT2 if "wpe/embedding" in expected_shapes else LLAMA3
    num_layers = expected_shapes["h/ln_1/scale"][0]
    head = detect_head_keys(tensors)
    if "adam.t" not in tensors:
        _fail(
            path,
            "tensor 'adam.t'",
            "present (Adam's step count)",
            "missing",
            "is this an Adam optimizer file?",
        )
    t = tensors["adam.t"]
    if t.dtype != KINT64 or t.shape != ():
        _fail(path, "tensor 'adam.t'", "a 0-d kINT64 (8)", f"dtype {t.dtype}, shape {t.shape}")
    params = layout.parameter_order(family, num_layers)
    expected_keys = {adam_key(k, family, num_layers, n, head) for n in params for k in "mv"} | {"adam.t"}
    for name in tensors:
        if name not in expected_keys:
            _fail(
                path,
                f"tensor '{name}'",
                f"an Adam key of this {family} model with {num_layers} layers",
                "a key that does not fit it",
            )
    trees = []
    for kind in "mv":
        named = {}
        for name in params:
            key = adam_key(kind, family, num_layers, name, head)
            if key not in tensors:
                _fail(path, f"tensor '{key}'", "present", "missing")
            named[name] = tensors.pop(key) if consume else tensors[key]
        # The tied GPT-2 tensor is one parameter: its moment stands for both stored names.
        if family == GPT2:
            named[TIED_HEAD] = named["transformer.wte.weight"]
            for i in range(num_layers):
                named[f"transformer.h.{i}.attn.bias"] = CkptTensor(
                    KFLOAT32, causal_mask(expected_shapes["wpe/embedding"][0])
                )
        trees.append(state_dict_to_tree(path, named, expected_shapes, consume, assemble))
    return trees[0], trees[1], int(t.array)


def trees_to_moments(family: str, mu: dict, nu: dict, count: int, vocab_size: int, head_keys: bool) -> dict:
    """(mu, nu, t) -> Adam StateDict entries in Adam::StateDict()'s libc++ order."""
    mu_leaves = _with_tied_head(family, _host_or_deferred(mu))
    nu_leaves = _with_tied_head(family, _host_or_deferred(nu))
    num_layers = mu_leaves["h/ln_1/scale"].shape[0]
    table = name_to_path(family, num_layers)
    values = {}
    for name in layout.parameter_order(family, num_layers):
        tree_path, layer, transposed = table[name]
        for kind, leaves in (("m", mu_leaves), ("v", nu_leaves)):
            value = _leaf(leaves[tree_path], layer, transposed)
            if name == "transformer.wte.weight":
                value = _first_rows(value, vocab_size)
            values[adam_key(kind, family, num_layers, name, head_keys)] = CkptTensor(KFLOAT32, value)
    values["adam.t"] = CkptTensor(KINT64, np.array(count, dtype=np.int64))
    order = layout.adam_key_order(family, num_layers, head_keys)
    return {key: values[key] for key in order}
