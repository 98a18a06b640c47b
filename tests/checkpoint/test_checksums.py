"""The per-tensor checksums of checkpoint/manager.py against a NumPy reference of the format its
docstring defines: two sums over the 32-bit patterns, plain and (index + 1)-weighted, modulo 2^32."""

import jax.numpy as jnp
import numpy as np

from jaxtrain.checkpoint.manager import tensor_checksums


def _numpy_checksum(array) -> str:
    """Both sums of the format, modulo 2^32, over the 32-bit patterns (small integers by value)."""
    array = np.asarray(array)
    bits = array.view(np.uint32) if array.dtype.itemsize == 4 else array.astype(np.uint32)
    bits = bits.reshape(-1).astype(np.uint64)
    weights = np.arange(1, bits.size + 1, dtype=np.uint64)  # products < 2^64; sums wrap mod 2^64
    return f'{int(bits.sum()) % 2**32:08x}:{int((bits * weights).sum()) % 2**32:08x}'


def test_checksums_equal_the_numpy_reference():
    rng = np.random.default_rng(0)
    tree = {
        'h': {'kernel': rng.standard_normal((3, 70_000)).astype(np.float32)},  # the weighted sum wraps
        'bias': np.float32([0.5, -0.0, np.inf]),
        'count': np.int32(7),
        'small': np.int16([3, -1]),  # not 32-bit: summed by value
    }
    expected = {'h/kernel': tree['h']['kernel'], **{k: tree[k] for k in ('bias', 'count', 'small')}}
    found = tensor_checksums({**tree, 'bias': jnp.asarray(tree['bias'])})  # host and device
    assert found == {name: _numpy_checksum(a) for name, a in expected.items()}


def test_host_checksum_summed_in_slices_equals_the_numpy_reference(monkeypatch):
    """A host array checked slice by slice along its first axis (a ragged last slice included)
    has the checksum the whole-array format gives."""
    from jaxtrain.checkpoint import manager

    monkeypatch.setattr(manager, 'HOST_SLICE_ELEMENTS', 1000)
    rng = np.random.default_rng(1)
    arrays = [
        rng.standard_normal((37, 70, 3)).astype(np.float32),  # 210-element rows, 4 a slice: 10 slices
        rng.standard_normal(2_501).astype(np.float32),  # 1-D: 1000-element slices, the last 501
        rng.standard_normal((3, 5_000)).astype(np.float32),  # a row over the slice size: one row a slice
        np.int32(-9),
        np.int16([[3, -1], [4, 5]]),
    ]
    for array in arrays:
        assert manager.host_checksum(array) == _numpy_checksum(array)
