"""Bit-level conversions the llm.c formats need: bf16 <-> fp32 and fp32 values in int32 slots.

bf16 is the top half of an fp32 after round-to-nearest-even, exactly as torch's `.to(torch.bfloat16)`
(which llm.c's Python writers use), so that a bf16 file we write is byte-identical to theirs.
NumPy has no bf16 dtype; bf16 values travel as their uint16 bit patterns.
"""

from __future__ import annotations

import numpy as np

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


def float_to_int32_bits(value: float) -> int:
    """The fp32 bit pattern of `value`, as the signed int32 stored in a header slot."""
    return int(np.array(value, dtype=np.float32).view(np.int32))


def int32_bits_to_float(bits: int) -> float:
    """The fp32 value whose bit pattern is the int32 header slot `bits`."""
    return float(np.array(bits, dtype=np.int32).view(np.float32))


def round_to_fp32(value: float) -> float:
    """`value` rounded to the nearest fp32, the precision a header float slot holds."""
    return float(np.float32(value))


def fp32_repr(value: float) -> str:
    """The shortest decimal that reads back as the same fp32: '1.4', not '1.399999976158142'."""
    return str(np.float32(value))


def is_fp32_subnormal_or_zero(bits: int) -> bool:
    """True when an int32 slot, read as fp32, has a zero exponent: +-0 or a subnormal.

    A small non-negative integer (e.g. 1, 0, 500000, anything below 2**23) looks like this, which is
    how an integer-truncated float slot is told apart from a real fp32 bit pattern.
    """
    return (int(bits) & 0x7F800000) == 0
