"""Per-tensor checksums, computed on the device so a save never waits on a host hash.

Two sums over each tensor's 32-bit patterns, modulo 2^32: the plain sum and the sum
weighted by (index + 1), which also catches swapped elements. Integer addition is
associative, so the result is the same for any sharding and reduction order — a
checkpoint saved on 8 devices verifies on 1.
"""

import jax
import jax.numpy as jnp


def _bits_u32(x):
    if x.dtype.itemsize == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
    return x.astype(jnp.uint32).reshape(-1)  # small integer leaves (optimizer counts)


@jax.jit
def _tensor_sums(tree):
    def sums(x):
        bits = _bits_u32(x)
        weights = jnp.arange(1, bits.size + 1, dtype=jnp.uint32)
        return jnp.stack([jnp.sum(bits, dtype=jnp.uint32), jnp.sum(bits * weights, dtype=jnp.uint32)])

    return jax.tree.map(sums, tree)


def path_name(path) -> str:
    """'h/attn/c_attn/kernel' for a pytree key path (dict keys, namedtuple fields, indices)."""
    parts = []
    for key in path:
        for attr in ('key', 'name', 'idx'):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
    return '/'.join(parts)


def start_tensor_sums(tree):
    """The checksums as device arrays, dispatched without waiting (for format_checksums)."""
    return _tensor_sums(tree)


def format_checksums(sums) -> dict[str, str]:
    """Fetches what start_tensor_sums dispatched, as tensor_checksums returns it."""
    sums = jax.device_get(sums)
    return {
        path_name(path): f'{int(s[0]):08x}:{int(s[1]):08x}'
        for path, s in jax.tree_util.tree_flatten_with_path(sums)[0]
    }


def tensor_checksums(tree) -> dict[str, str]:
    """{'h/attn/c_attn/kernel': '1a2b3c4d:5e6f7a8b', ...} for every array leaf of `tree`."""
    return format_checksums(start_tensor_sums(tree))


def checksum_mismatches(tree, expected: dict[str, str], item: str) -> list[str]:
    found = tensor_checksums(tree)
    problems = []
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            problems.append(f'{item}/{name}: listed in trainer_state but not restored')
        elif name not in expected:
            problems.append(f'{item}/{name}: restored but has no recorded checksum')
        elif found[name] != expected[name]:
            problems.append(f'{item}/{name}: checksum expected {expected[name]}, found {found[name]}')
    return problems
