"""The declarative tensor tables of llm.c files, and moving tensors between files and parameter trees.

A format is a table of rows (llm.c name, tree path, file shape). File shapes are written with
symbols ("L", "3C", ...) that a header turns into numbers, so the table reads like docs/formats.md.
Linear weights are stored (out, in) in the file; a tree path ending in "/kernel" holds the transpose,
(in, out), as Flax does (llmc_io/PARAMS_SPEC.md). Per-layer tensors are stacked over L on axis 0 in both.

bf16 is the top half of an fp32 after round-to-nearest-even, exactly as torch's `.to(torch.bfloat16)`
(which llm.c's Python writers use), so that a bf16 file we write is byte-identical to theirs.
NumPy has no bf16 dtype; bf16 values travel as their uint16 bit patterns.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import os
from collections.abc import Iterable, Mapping

import numpy as np

from llmc_io.atomic_file import write_pieces_atomically
from llmc_io.errors import LLMCFormatError

# torch turns every NaN (either sign, any payload) into this one quiet NaN.
BF16_NAN_BITS = 0x7FC0


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns of `x` rounded to nearest, ties to even; NaN -> 0x7FC0.

    Values beyond the largest bf16 round to +-inf; subnormals are kept (no flush to zero).
    """
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    u = x32.view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds half to even. uint32 cannot overflow here except
    # for NaNs with the top bits set, and NaNs are replaced below.
    lowest_kept = (u >> 16) & 1
    with np.errstate(over="ignore"):
        rounded = ((u + np.uint32(0x7FFF) + lowest_kept) >> 16).astype(np.uint16)
    return np.where(np.isnan(x32), np.uint16(BF16_NAN_BITS), rounded)


def bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    """float32 values of uint16 bf16 bit patterns (exact: bf16 is a truncated fp32)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# Version slot -> (dtype name, on-disk NumPy dtype of one value).
VERSION_DTYPES = {3: ("float32", np.dtype("<f4")), 5: ("bfloat16", np.dtype("<u2"))}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str  # llm.c's name, used in error messages
    tree_path: str | None  # where the tensor lives in the params tree; None: not kept
    shape: tuple[int, ...]  # shape in the file, (out, in) for linear weights

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def tree_shape(self) -> tuple[int, ...]:
        return transposed_shape(self.shape) if is_kernel(self.tree_path) else self.shape


def resolve(
    table: Iterable[tuple[str, str | None, tuple[str, ...]]], dims: Mapping[str, int]
) -> list[TensorSpec]:
    """Turn a symbolic table into concrete TensorSpecs using `dims` (symbol -> size)."""
    return [TensorSpec(name, path, tuple(int(dims[s]) for s in shape)) for name, path, shape in table]


def total_size(specs: Iterable[TensorSpec]) -> int:
    return sum(spec.size for spec in specs)


def is_kernel(tree_path: str | None) -> bool:
    return tree_path is not None and tree_path.endswith("/kernel")


def transposed_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape[:-2] + (shape[-1], shape[-2])


def file_to_tree(array: np.ndarray, tree_path: str) -> np.ndarray:
    """(…, out, in) -> (…, in, out) for kernels; always a fresh, writable, C-contiguous float32 copy,
    so the tree never shares memory with a memory-mapped file."""
    if is_kernel(tree_path):
        array = np.swapaxes(array, -1, -2)
    return np.array(array, dtype=np.float32, copy=True, order="C")


def tree_to_file(array: np.ndarray, tree_path: str) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(array, -1, -2)) if is_kernel(tree_path) else array


# ---- reading -------------------------------------------------------------------------------------


def read_tensors(
    path: str | os.PathLike, specs: list[TensorSpec], data_offset: int, version: int
) -> dict[str, np.ndarray]:
    """Every tensor of `specs`, in file orientation, as float32 arrays.

    The file is memory-mapped: fp32 tensors come back as read-only views of the map (file_to_tree
    then makes the one copy the tree needs, transposing on the way), bf16 tensors as upcast copies.
    Non-finite values are rejected here, with the tensor named: a NaN checkpoint is never a valid
    starting point, and finding out at load time beats finding out as a NaN loss.
    """
    _, disk_dtype = VERSION_DTYPES[version]
    data = np.memmap(path, dtype=disk_dtype, mode="r", offset=data_offset, shape=(total_size(specs),))
    tensors = {}
    start = 0
    for spec in specs:
        raw = data[start : start + spec.size].reshape(spec.shape)
        start += spec.size
        values = bf16_bits_to_fp32(raw) if version == 5 else raw.astype(np.float32, copy=False)
        check_finite(path, spec, values)
        tensors[spec.name] = values
    return tensors


# The side of the square tiles a transposed matrix is copied in. NumPy's own copy of a transposed
# (2048, 8192) fp32 view walks one side with a stride of a whole row and ran at 0.3-0.65 GB/s a
# thread; 256 x 256 tiles (256 KiB, in a core's L2) ran at 1.3 GB/s.
_TILE = 256


def copy_into(out: np.ndarray, values: np.ndarray) -> np.ndarray:
    """out[...] = values (converted to out's dtype), in tiles where values is a transposed view
    (a 2-D array that is not C-contiguous); returns out."""
    if values.ndim != 2 or values.flags.c_contiguous or values.size < _TILE * _TILE:
        np.copyto(out, values, casting="unsafe")
        return out
    rows, cols = values.shape
    for i in range(0, rows, _TILE):
        for j in range(0, cols, _TILE):
            out[i : i + _TILE, j : j + _TILE] = values[i : i + _TILE, j : j + _TILE]
    return out


def contiguous(values: np.ndarray, dtype=None) -> np.ndarray:
    """np.ascontiguousarray(values, dtype), with a transposed view copied in tiles (copy_into)."""
    values = np.asarray(values)
    dtype = np.dtype(dtype or values.dtype)
    if values.flags.c_contiguous and values.dtype == dtype:
        return values
    if values.ndim == 0:
        return np.asarray(values, dtype=dtype)
    return copy_into(np.empty(values.shape, dtype), values)


# Elements per piece of all_finite's check: 64 MiB of fp32.
_FINITE_PIECE = 1 << 24


@dataclasses.dataclass
class FileLeaf:
    """A tree leaf as a state-dict file holds it, not yet made: the fp32 arrays of its layers (one
    for a leaf of no layer), each in the file's (out, in) orientation. Stacking and transposing
    are copies of every byte: a restore onto an accelerator makes them there, where they cost next
    to nothing (jaxtrain/optim/optimizer.py put_tree), rather than on the host, where a 1B model's
    kernels take seconds; assemble() is the host's way, which np.asarray also takes."""

    parts: list  # NumPy arrays, or a device's (read_state_dict's place)
    stacked: bool  # parts are layers, stacked on a new axis 0
    transposed: bool  # the leaf is each part's transpose (a kernel's (in, out))
    dtype = np.dtype(np.float32)

    @property
    def shape(self) -> tuple[int, ...]:
        shape = tuple(self.parts[0].shape)
        if self.transposed:
            shape = shape[:-2] + (shape[-1], shape[-2])
        return (len(self.parts), *shape) if self.stacked else shape

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def assemble(self) -> np.ndarray:
        views = [np.swapaxes(part, -1, -2) if self.transposed else part for part in self.parts]
        if not self.stacked:
            return contiguous(views[0], np.float32)
        out = np.empty(self.shape, np.float32)
        for i, view in enumerate(views):
            copy_into(out[i], view)
        return out

    def take_parts(self) -> list:
        """The parts, which leave this FileLeaf (it is made once): a restore frees each leaf's
        parts as soon as it has made the leaf of them."""
        parts, self.parts = self.parts, []
        return parts

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        made = self.assemble()
        return made if dtype is None else made.astype(dtype, copy=False)


@dataclasses.dataclass(frozen=True)
class LeafEntry:
    """One fp32 state-dict entry cut from a tree leaf that is not on the host (a device array):
    `source[layer]` (all of it for no layer), transposed where the file is (out, in), its first
    `rows` rows. Nothing is fetched until the writer needs the entry's bytes (fetch()), so a file
    is written holding a few entries on the host, never every leaf it is cut from. The source
    is indexed before it is fetched (a device slice of one layer), so each layer crosses once."""

    source: object  # anything with .shape that np.asarray fetches, indexable by a layer
    layer: int | None = None
    transposed: bool = False
    rows: int | None = None
    dtype = np.dtype(np.float32)

    @property
    def shape(self) -> tuple[int, ...]:
        shape = tuple(self.source.shape)[0 if self.layer is None else 1 :]
        if self.transposed:
            shape = shape[:-2] + (shape[-1], shape[-2])
        return shape if self.rows is None else (min(self.rows, shape[0]), *shape[1:])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def first_rows(self, rows: int) -> "LeafEntry":
        return dataclasses.replace(self, rows=rows if self.rows is None else min(rows, self.rows))

    def fetch(self) -> np.ndarray:
        """The entry's values in the file's orientation (a view of the fetched array)."""
        part = self.source if self.layer is None else self.source[self.layer]
        value = np.asarray(part, dtype=np.float32)
        value = np.swapaxes(value, -1, -2) if self.transposed else value
        return value if self.rows is None else value[: self.rows]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        value = self.fetch()
        return value if dtype is None else value.astype(dtype, copy=False)


def all_finite(values: np.ndarray) -> bool:
    """Whether every value is finite, checked in pieces on several threads (NumPy's ufuncs let go
    of the GIL): a 1B model's weights and moments, 17 GiB, in seconds rather than half a minute,
    and never a boolean copy of a whole tensor. A FileLeaf's parts are checked as they are, and an
    array of another array-API library (a device's) where it is, by its own functions."""
    if isinstance(values, FileLeaf):
        return all(all_finite(part) for part in values.parts)
    if not isinstance(values, np.ndarray) and hasattr(values, "__array_namespace__"):
        xp = values.__array_namespace__()
        return bool(xp.all(xp.isfinite(values)))
    flat = np.asarray(values).reshape(-1)
    if flat.size <= _FINITE_PIECE:
        return bool(np.isfinite(flat).all())
    pieces = (flat[start : start + _FINITE_PIECE] for start in range(0, flat.size, _FINITE_PIECE))
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        return all(pool.map(lambda piece: bool(np.isfinite(piece).all()), pieces))


def check_finite(path: str | os.PathLike, spec: TensorSpec, values: np.ndarray) -> None:
    if all_finite(values):
        return
    finite = np.isfinite(values)
    bad = ~finite
    num_nan = int(np.isnan(values).sum())
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f"tensor {spec.name}" + (f" ({spec.tree_path})" if spec.tree_path else "")
    raise LLMCFormatError(
        path,
        where,
        "finite values",
        f"{num_nan} NaN and {int(bad.sum()) - num_nan} inf, the first at index {first}",
        "the run that wrote it diverged or the file is corrupt; use an earlier checkpoint",
    )


# ---- parameter trees -----------------------------------------------------------------------------


def tree_set(tree: dict, tree_path: str, value: np.ndarray) -> None:
    *parents, leaf = tree_path.split("/")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def tree_leaves(tree: Mapping, prefix: str = "") -> dict[str, object]:
    """{'a/b/c': leaf} for every non-mapping leaf of a nested mapping."""
    leaves = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            leaves.update(tree_leaves(value, path + "/"))
        else:
            leaves[path] = value
    return leaves


def tree_arrays_for_writing(
    path: str | os.PathLike,
    params: Mapping,
    expected_shapes: Mapping[str, tuple[int, ...]],
    extra_hint: str = "",
) -> dict[str, np.ndarray]:
    """The float32 arrays of `params`, checked to have exactly the expected paths and shapes.

    Accepts anything np.asarray understands (NumPy, JAX arrays, bf16 via ml_dtypes), so the
    trainer can hand over its state without converting it first.
    """
    leaves = tree_leaves(params)
    for tree_path in expected_shapes:
        if tree_path not in leaves:
            raise LLMCFormatError(
                path,
                f"params[{tree_path}]",
                "an array",
                "nothing",
                "the parameter tree is missing this entry",
            )
    for tree_path in leaves:
        if tree_path not in expected_shapes:
            raise LLMCFormatError(
                path,
                f"params[{tree_path}]",
                "no such entry",
                "an array",
                extra_hint or "the file format has no place for it",
            )
    arrays = {}
    for tree_path, shape in expected_shapes.items():
        array = np.asarray(leaves[tree_path], dtype=np.float32)
        if array.shape != tuple(shape):
            hint = None
            if is_kernel(tree_path):
                hint = "kernels are (in, out), the transpose of llm.c's (out, in)"
            raise LLMCFormatError(
                path, f"params[{tree_path}]", f"shape {tuple(shape)}", f"shape {array.shape}", hint
            )
        arrays[tree_path] = array
    return arrays


# ---- writing -------------------------------------------------------------------------------------


def write_file(path: str | os.PathLike, header: bytes, arrays: Iterable[np.ndarray], version: int) -> str:
    """Header, then each array in order in the dtype of `version`, written atomically; returns the
    file's sha256 (hex), taken as it is written.

    The file appears under its name only once complete (write to a temporary file, then rename), so a
    crash mid-save never leaves a truncated checkpoint behind and `convert A A` cannot corrupt A.
    """
    _, disk_dtype = VERSION_DTYPES[version]

    def on_disk(array):
        if version == 5:
            return fp32_to_bf16_bits(array).astype(disk_dtype, copy=False)
        return np.ascontiguousarray(array, dtype=disk_dtype)

    pieces = (lambda array=array: on_disk(array) for array in arrays)
    return write_pieces_atomically(path, itertools.chain([lambda: header], pieces))
