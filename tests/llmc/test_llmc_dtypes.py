"""bf16 rounding and fp32 header bit patterns against independent references.

Expected bf16 bits are written out by hand from the round-to-nearest-even rule and checked against
ml_dtypes.bfloat16 (an independent implementation) where it agrees with torch; for NaN, torch's
rule (every NaN -> 0x7FC0) differs from ml_dtypes (which keeps the sign), so NaN is pinned by hand.
"""

import numpy as np
import pytest

from llmc_io.header import float_to_int32_bits, int32_bits_to_float, is_fp32_subnormal_or_zero, round_to_fp32
from llmc_io.tensors import bf16_bits_to_fp32, fp32_to_bf16_bits

# fp32 bit pattern -> bf16 bit pattern, by hand.
HAND_CASES = {
    0x3F800000: 0x3F80,  # 1.0 exactly representable
    0x3F807FFF: 0x3F80,  # just below the halfway point: down
    0x3F808000: 0x3F80,  # halfway, kept bit even (0): stays (ties to even)
    0x3F808001: 0x3F81,  # just above halfway: up
    0x3F818000: 0x3F82,  # halfway, kept bit odd (1): up to even
    0xBF818000: 0xBF82,  # same, negative
    0x7F7F0000: 0x7F7F,  # largest finite bf16
    0x7F7F7FFF: 0x7F7F,  # below halfway to the next (inf)
    0x7F7F8000: 0x7F80,  # halfway, odd: rounds up to +inf
    0x7F7FFFFF: 0x7F80,  # largest finite fp32 -> +inf
    0xFF7FFFFF: 0xFF80,  # most negative finite fp32 -> -inf
    0x7F800000: 0x7F80,  # +inf
    0xFF800000: 0xFF80,  # -inf
    0x00000000: 0x0000,  # +0
    0x80000000: 0x8000,  # -0 keeps its sign
    0x00000001: 0x0000,  # smallest fp32 subnormal: down to 0
    0x80000001: 0x8000,  # ... to -0
    0x00008000: 0x0000,  # subnormal halfway, even: stays 0
    0x00018000: 0x0002,  # subnormal halfway, odd: up (no flush to zero)
    0x00010000: 0x0001,  # smallest bf16 subnormal
    0x007FFFFF: 0x0080,  # largest fp32 subnormal rounds up to the smallest normal
}
NAN_PATTERNS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF]


def _from_bits(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def test_bf16_rounding_hand_cases():
    got = fp32_to_bf16_bits(_from_bits(list(HAND_CASES)))
    assert got.dtype == np.uint16
    assert [hex(v) for v in got] == [hex(v) for v in HAND_CASES.values()]


def test_every_nan_becomes_7fc0_like_torch():
    # A naive rounding would turn 0x7F800001 into inf and 0xFFFFFFFF into 0x0000 (uint32 wrap).
    assert (fp32_to_bf16_bits(_from_bits(NAN_PATTERNS)) == 0x7FC0).all()


def test_bf16_rounding_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(0)
    bits = np.concatenate(
        [
            rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),
            np.array(list(HAND_CASES), dtype=np.uint32),
        ]
    )
    values = bits.view(np.float32)
    values = values[~np.isnan(values)]
    expected = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(fp32_to_bf16_bits(values), expected)


def test_bf16_to_fp32_and_back_is_exact_for_every_non_nan_pattern():
    bits = np.arange(2**16, dtype=np.uint16)
    values = bf16_bits_to_fp32(bits)
    assert values.dtype == np.float32
    # Upcasting puts the 16 bits on top of 16 zero bits.
    np.testing.assert_array_equal(values.view(np.uint32), bits.astype(np.uint32) << 16)
    keep = ~np.isnan(values)
    np.testing.assert_array_equal(fp32_to_bf16_bits(values[keep]), bits[keep])


def test_fp32_bit_patterns_of_header_floats():
    # docs/formats.md §2a check values.
    assert float_to_int32_bits(1.4) == 0x3FB33333
    assert float_to_int32_bits(1e-5) == 0x3727C5AC
    assert float_to_int32_bits(500000.0) == 0x48F42400
    assert float_to_int32_bits(-2.0) == -0x40000000  # sign bit set: a negative int32
    assert int32_bits_to_float(0x3FB33333) == round_to_fp32(1.4) == np.float32(1.4)
    assert int32_bits_to_float(0x48F42400) == 500000.0


def test_truncated_integers_read_as_zero_or_subnormal_floats():
    # What llm.c master stores for 1.4, 1e-5 and 500000: int(1.4), int(1e-5), int(500000).
    assert all(is_fp32_subnormal_or_zero(v) for v in (1, 0, 500000, 1024))
    assert not any(is_fp32_subnormal_or_zero(float_to_int32_bits(v)) for v in (1.4, 1e-5, 500000.0, 1.0))
