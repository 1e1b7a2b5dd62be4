"""common.cuh's `fast_divmod`: the arithmetic, checked on the CPU against Python's integer division.

The kernels divide by run-time divisors that are fixed for a whole launch (the
padded plane and row of conv3x3_patch_wgmma, C / 64 and S in the implicit-GEMM
loaders) with a multiply-high and a shift instead of the integer division
sequence. This mirrors the constructor and `div` in Python, bit for bit
(32-bit unsigned multiply-high, the ceil(log2 d) from the count of leading
zeros of d - 1), and checks every quotient and remainder against `//` and `%`:
the divisors the engine uses, every divisor up to 4096, powers of two and
their neighbours up to 2^30, at the ends of the dividend range [0, 2^31) and on
random dividends. The kernels themselves are checked on the GPU (gpu_check.sh
check: every convolution against a float64 reference).
"""

from __future__ import annotations

import random

import pytest

from fusedresnet.kernels.build import KERNEL_DIR

U32 = (1 << 32) - 1


def clz32(v: int) -> int:
    """CUDA's __clz for a 32-bit value (32 for 0)."""
    return 32 - (v & U32).bit_length()


def build(d: int) -> tuple[int, int]:
    """(multiplier, shift) as fast_divmod's constructor computes them (0, 0 for d = 1)."""
    if d <= 1:
        return 0, 0
    log2_ceil = 32 - clz32(d - 1)
    multiplier = ((1 << (31 + log2_ceil)) + d - 1) // d
    assert multiplier <= U32, (d, multiplier)   # the constructor truncates to 32 bits: it must fit
    return multiplier, log2_ceil - 1


def div(n: int, d: int, multiplier: int, shift: int) -> int:
    """fast_divmod::div: __umulhi(n, multiplier) >> shift, or n when d == 1."""
    if d == 1:
        return n
    return ((n * multiplier) >> 32) >> shift


def _divisors() -> list[int]:
    engine = {58 * 58, 58, 30 * 30, 30, 1, 2, 3, 4, 8, 7 * 7, 226 * 226}   # planes and rows of the padded grids
    small = set(range(1, 4097))
    powers = {p + e for k in range(1, 31) for p in (1 << k,) for e in (-1, 0, 1)}
    rng = random.Random(20261123)
    wide = {rng.randrange(4097, 1 << 31) for _ in range(300)}
    return sorted(d for d in engine | small | powers | wide if 1 <= d < (1 << 31))


def _dividends(d: int, rng: random.Random) -> list[int]:
    top = (1 << 31) - 1
    edges = [0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, top, top - 1, top - d, top - (top % d), top - (top % d) - 1]
    return [n for n in edges if 0 <= n <= top] + [rng.randrange(0, top + 1) for _ in range(64)]


def test_quotient_and_remainder_match_integer_division():
    rng = random.Random(7)
    checked = 0
    for d in _divisors():
        multiplier, shift = build(d)
        for n in _dividends(d, rng):
            q = div(n, d, multiplier, shift)
            assert q == n // d, (n, d, q)
            assert n - q * d == n % d
            checked += 1
    assert checked > 300_000


def test_a_wrong_rounding_would_be_caught():
    """The check above can fail: rounding the multiplier down (floor instead of ceil) breaks some quotient."""
    wrong = 0
    for d in range(3, 200):
        if d & (d - 1) == 0:
            continue
        log2_ceil = 32 - clz32(d - 1)
        multiplier = (1 << (31 + log2_ceil)) // d   # floor: too small by up to 1
        n = (1 << 31) - 1 - ((1 << 31) - 1) % d   # a multiple of d near the top of the range
        if div(n, d, multiplier, log2_ceil - 1) != n // d:
            wrong += 1
    assert wrong > 0


@pytest.mark.parametrize("needle", [
    "const unsigned int l = 32u - (unsigned int)__clz(d - 1);",
    "multiplier = (unsigned int)(((1ull << (31u + l)) + (u64)d - 1ull) / (u64)d);",
    "shift = l - 1u;",
    "return divisor == 1 ? n : (int)(__umulhi((unsigned int)n, multiplier) >> shift);",
])
def test_the_mirror_is_the_kernel_source(needle):
    """The Python mirror above follows these lines of common.cuh; a change there must change the mirror."""
    assert needle in (KERNEL_DIR / "common.cuh").read_text()
