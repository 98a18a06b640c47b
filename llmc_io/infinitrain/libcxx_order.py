"""The iteration order of libc++'s std::unordered_map<std::string, T>, re-implemented.

InfiniTrain keeps parameters, buffers and submodules in std::unordered_map, so two of its file facts are
that map's iteration order: the entry order of a CKPT file, and the parameter index i of HEAD's Adam keys
`adam.m.{i}` (the position in Module::Parameters(), which walks the maps). The real binary was built with
clang/libc++ 16 (../shared/infinitrain/README.md), so the order is libc++'s, which this module computes:

* std::hash<std::string> on 64-bit is libc++'s CityHash64 variant (__murmur2_or_cityhash<size_t, 64>,
  libcxx/include/__functional/hash.h), including the ABI quirk of the 4..8-byte case (a uint32 shift).
* __hash_table: max_load_factor 1; growth to max(2*bc + !pow2(bc), size+1), rounded to the next prime;
  a new key goes to the front of the node list if its bucket is empty, else to the front of its bucket's
  run; a rehash relinks nodes as __do_rehash<true> does.

Only growth and insertion are modelled (InfiniTrain's maps never erase). Checked against the entry order of
every real file in ../shared/infinitrain (tests/llmc/test_infinitrain_real_files.py).
"""

from __future__ import annotations

import struct

_MASK = (1 << 64) - 1
_K0 = 0xC3A5C85C97CB3127
_K1 = 0xB492B66FBE98F273
_K2 = 0x9AE16A3B2F90404F
_K3 = 0xC949D7C7509E6557
_MUL = 0x9DDFEA08EB382D69


def _u64(s: bytes, i: int) -> int:
    return struct.unpack_from("<Q", s, i)[0]


def _u32(s: bytes, i: int) -> int:
    return struct.unpack_from("<I", s, i)[0]


def _rot(v: int, shift: int) -> int:
    return v if shift == 0 else ((v >> shift) | (v << (64 - shift))) & _MASK


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def _hash16(u: int, v: int) -> int:
    a = ((u ^ v) * _MUL) & _MASK
    a ^= a >> 47
    b = ((v ^ a) * _MUL) & _MASK
    b ^= b >> 47
    return (b * _MUL) & _MASK


def _len0to16(s: bytes) -> int:
    n = len(s)
    if n > 8:
        a, b = _u64(s, 0), _u64(s, n - 8)
        return _hash16(a, _rot((b + n) & _MASK, n)) ^ b
    if n >= 4:
        a, b = _u32(s, 0), _u32(s, n - 4)
        # libc++ without _LIBCPP_ABI_FIX_CITYHASH_IMPLEMENTATION shifts the uint32 before widening.
        return _hash16((n + ((a << 3) & 0xFFFFFFFF)) & _MASK, b)
    if n > 0:
        y = (s[0] + (s[n >> 1] << 8)) & 0xFFFFFFFF
        z = (n + (s[n - 1] << 2)) & 0xFFFFFFFF
        return (_shift_mix(((y * _K2) ^ (z * _K3)) & _MASK) * _K2) & _MASK
    return _K2


def _len17to32(s: bytes) -> int:
    n = len(s)
    a = (_u64(s, 0) * _K1) & _MASK
    b = _u64(s, 8)
    c = (_u64(s, n - 8) * _K2) & _MASK
    d = (_u64(s, n - 16) * _K0) & _MASK
    return _hash16(
        (_rot((a - b) & _MASK, 43) + _rot(c, 30) + d) & _MASK,
        (a + _rot(b ^ _K3, 20) - c + n) & _MASK,
    )


def _weak32(w: int, x: int, y: int, z: int, a: int, b: int) -> tuple[int, int]:
    a = (a + w) & _MASK
    b = _rot((b + a + z) & _MASK, 21)
    c = a
    a = (a + x + y) & _MASK
    b = (b + _rot(a, 44)) & _MASK
    return (a + z) & _MASK, (b + c) & _MASK


def _weak32_at(s: bytes, i: int, a: int, b: int) -> tuple[int, int]:
    return _weak32(_u64(s, i), _u64(s, i + 8), _u64(s, i + 16), _u64(s, i + 24), a, b)


def _len33to64(s: bytes) -> int:
    n = len(s)
    z = _u64(s, 24)
    a = (_u64(s, 0) + (n + _u64(s, n - 16)) * _K0) & _MASK
    b = _rot((a + z) & _MASK, 52)
    c = _rot(a, 37)
    a = (a + _u64(s, 8)) & _MASK
    c = (c + _rot(a, 7)) & _MASK
    a = (a + _u64(s, 16)) & _MASK
    vf = (a + z) & _MASK
    vs = (b + _rot(a, 31) + c) & _MASK
    a = (_u64(s, 16) + _u64(s, n - 32)) & _MASK
    z = (z + _u64(s, n - 8)) & _MASK
    b = _rot((a + z) & _MASK, 52)
    c = _rot(a, 37)
    a = (a + _u64(s, n - 24)) & _MASK
    c = (c + _rot(a, 7)) & _MASK
    a = (a + _u64(s, n - 16)) & _MASK
    wf = (a + z) & _MASK
    ws = (b + _rot(a, 31) + c) & _MASK
    r = _shift_mix(((vf + ws) * _K2 + (wf + vs) * _K0) & _MASK)
    return (_shift_mix((r * _K0 + vs) & _MASK) * _K2) & _MASK


def _len_over64(s: bytes) -> int:
    n = len(s)
    x = _u64(s, n - 40)
    y = (_u64(s, n - 16) + _u64(s, n - 56)) & _MASK
    z = _hash16((_u64(s, n - 48) + n) & _MASK, _u64(s, n - 24))
    v = _weak32_at(s, n - 64, n, z)
    w = _weak32_at(s, n - 32, (y + _K1) & _MASK, x)
    x = (x * _K1 + _u64(s, 0)) & _MASK
    remaining = (n - 1) & ~63
    pos = 0
    while True:
        x = (_rot((x + y + v[0] + _u64(s, pos + 8)) & _MASK, 37) * _K1) & _MASK
        y = (_rot((y + v[1] + _u64(s, pos + 48)) & _MASK, 42) * _K1) & _MASK
        x ^= w[1]
        y = (y + v[0] + _u64(s, pos + 40)) & _MASK
        z = (_rot((z + w[0]) & _MASK, 33) * _K1) & _MASK
        v = _weak32_at(s, pos, (v[1] * _K1) & _MASK, (x + w[0]) & _MASK)
        w = _weak32_at(s, pos + 32, (z + w[1]) & _MASK, (y + _u64(s, pos + 16)) & _MASK)
        z, x = x, z
        pos += 64
        remaining -= 64
        if remaining == 0:
            break
    return _hash16(
        (_hash16(v[0], w[0]) + _shift_mix(y) * _K1 + z) & _MASK,
        (_hash16(v[1], w[1]) + x) & _MASK,
    )


def string_hash(key: str) -> int:
    """std::hash<std::string>()(key) of libc++ on a 64-bit target."""
    s = key.encode("utf-8")
    if len(s) <= 16:
        return _len0to16(s)
    if len(s) <= 32:
        return _len17to32(s)
    if len(s) <= 64:
        return _len33to64(s)
    return _len_over64(s)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def _next_prime(n: int) -> int:
    while not _is_prime(n):
        n += 1
    return n


def _constrain(h: int, bc: int) -> int:
    return h & (bc - 1) if (bc & (bc - 1)) == 0 else (h if h < bc else h % bc)


class LibcxxStringMap:
    """Keys of an unordered_map<string, T> built by insertions only; `keys()` is its iteration order."""

    def __init__(self, keys=()):
        self._next: dict[object, object] = {None: None}  # node -> next node; None is the before-begin anchor
        self._hash: dict[str, int] = {}
        self._buckets: list = []  # bucket -> the node BEFORE the bucket's first node (or None: empty)
        for key in keys:
            self.insert(key)

    def __len__(self) -> int:
        return len(self._hash)

    def __contains__(self, key: str) -> bool:
        return key in self._hash

    def insert(self, key: str) -> None:
        """emplace / operator[] of a key: nothing if present, else link a new node as libc++ does."""
        if key in self._hash:
            return
        h = string_hash(key)
        bc = len(self._buckets)
        size = len(self._hash)
        if size + 1 > bc or bc == 0:
            is_pow2 = bc > 2 and (bc & (bc - 1)) == 0
            self._rehash(max(2 * bc + (not is_pow2), size + 1))
            bc = len(self._buckets)
        self._hash[key] = h
        chash = _constrain(h, bc)
        before = self._buckets[chash]
        if before is None:
            self._next[key] = self._next[None]
            self._next[None] = key
            self._buckets[chash] = _ANCHOR
            following = self._next[key]
            if following is not None:
                self._buckets[_constrain(self._hash[following], bc)] = key
        else:
            node = None if before is _ANCHOR else before
            self._next[key] = self._next[node]
            self._next[node] = key

    def _rehash(self, n: int) -> None:
        if n == 1:
            n = 2
        elif n & (n - 1):
            n = _next_prime(n)
        if n <= len(self._buckets):
            return
        buckets: list = [None] * n
        pp = None  # anchor
        cp = self._next[None]
        if cp is not None:
            chash = _constrain(self._hash[cp], n)
            buckets[chash] = _ANCHOR
            phash = chash
            pp, cp = cp, self._next[cp]
            while cp is not None:
                chash = _constrain(self._hash[cp], n)
                if chash == phash:
                    pp = cp
                elif buckets[chash] is None:
                    buckets[chash] = pp
                    pp = cp
                    phash = chash
                else:
                    head = None if buckets[chash] is _ANCHOR else buckets[chash]
                    self._next[pp] = self._next[cp]
                    self._next[cp] = self._next[head]
                    self._next[head] = cp
                cp = self._next[pp]
        self._buckets = buckets

    def keys(self) -> list[str]:
        out, node = [], self._next[None]
        while node is not None:
            out.append(node)
            node = self._next[node]
        return out


class _Anchor:
    """Marks 'the bucket's predecessor is the before-begin node' (distinct from an empty bucket)."""


_ANCHOR = _Anchor()
