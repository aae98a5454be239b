"""``splitmix64``: the one 64-bit integer mix of the project — a request's hash tail (``request.HashTail``), a
session's place on the affinity ring (``fleet.hash_ring``), a speculative token's acceptance draw
(``speculation``). The workload's numpy block keys are the same function on arrays (``workload.block_keys``).

On Python ints each product of the plain formula is a 128-bit big int (about 7 k instructions per call
compiled); compiled, the 64-bit value is two 32-bit halves and each product a sum of 16-bit limb products, all
machine integers. Interpreted, the limbs are the slow way (3.6 us a call against 0.33 us for the plain formula,
which made splitmix64 about 65 % of a pure-Python run of speculative.yaml: its acceptance draws), so each build
takes its own: the same value bit for bit (``tests/simulator/core/test_mix.py`` holds both to the formula).
Standard library only: the real engine and the simulator both run it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python

MASK64: Final = (1 << 64) - 1
SPLITMIX_GOLDEN: Final = 0x9E3779B97F4A7C15
SPLITMIX_MUL1: Final = 0xBF58476D1CE4E5B9
SPLITMIX_MUL2: Final = 0x94D049BB133111EB
"""splitmix64's finaliser constants."""

_LOW32: Final = 0xFFFFFFFF
_LOW16: Final = 0xFFFF


def splitmix64(z: int) -> int:
    """splitmix64's finaliser of any integer (taken modulo 2**64): a bijection on 64-bit values that spreads
    each input bit over all output bits. Equal, bit for bit, to ``z = (z + GOLDEN) & MASK; z = ((z ^ (z >>
    30)) * MUL1) & MASK; z = ((z ^ (z >> 27)) * MUL2) & MASK; z ^ (z >> 31)``."""
    if COMPILED:
        return on_limbs(z)
    return on_big_ints(z)


def on_big_ints(z: int) -> int:
    """``splitmix64`` by the plain formula: the fast way interpreted."""
    z = (z + SPLITMIX_GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * SPLITMIX_MUL1) & MASK64
    z = ((z ^ (z >> 27)) * SPLITMIX_MUL2) & MASK64
    return z ^ (z >> 31)


def on_limbs(z: int) -> int:
    """``splitmix64`` on 32-bit halves and 16-bit limb products: the fast way compiled."""
    high, low = mix_halves((z >> 32) & _LOW32, z & _LOW32)
    return (int(high) << 32) | int(low)


def mix_halves(high: i64, low: i64) -> tuple[i64, i64]:
    """``splitmix64`` of the 64-bit value ``high * 2**32 + low`` (each half below 2**32), as its halves: with
    ``add_halves`` and ``times``, a chain of mixes runs on machine integers alone once compiled, where a
    64-bit Python int between them is a big int (each operation on it a few hundred instructions)."""
    low += 0x7F4A7C15  # z += GOLDEN (mod 2**64), on the halves
    high += 0x9E3779B9 + (low >> 32)
    low &= _LOW32
    high &= _LOW32
    low ^= ((low >> 30) | (high << 2)) & _LOW32  # z ^= z >> 30
    high ^= high >> 30
    high, low = times(high, low, 0xBF58, 0x476D, 0x1CE4, 0xE5B9)  # z *= MUL1 (mod 2**64)
    low ^= ((low >> 27) | (high << 5)) & _LOW32
    high ^= high >> 27
    high, low = times(high, low, 0x94D0, 0x49BB, 0x1331, 0x11EB)  # z *= MUL2
    low ^= ((low >> 31) | (high << 1)) & _LOW32
    high ^= high >> 31
    return high, low


def add_halves(high: i64, low: i64, value: int) -> tuple[i64, i64]:
    """The halves of ``high * 2**32 + low + value`` (mod 2**64), for any integer ``value``."""
    low += value & _LOW32
    high = (high + ((value >> 32) & _LOW32) + (low >> 32)) & _LOW32
    return high, low & _LOW32


def times(high: i64, low: i64, b3: i64, b2: i64, b1: i64, b0: i64) -> tuple[i64, i64]:
    """(high, low) halves of ``z * b mod 2**64`` for z given as halves and b as 16-bit limbs, most
    significant first: schoolbook limb products (each below 2**32, their sums below 2**35)."""
    a0 = low & _LOW16
    a1 = low >> 16
    a2 = high & _LOW16
    a3 = high >> 16
    c0 = a0 * b0
    c1 = a0 * b1 + a1 * b0 + (c0 >> 16)
    c2 = a0 * b2 + a1 * b1 + a2 * b0 + (c1 >> 16)
    c3 = a0 * b3 + a1 * b2 + a2 * b1 + a3 * b0 + (c2 >> 16)
    return ((c3 & _LOW16) << 16) | (c2 & _LOW16), ((c1 & _LOW16) << 16) | (c0 & _LOW16)


COMPILED: Final = not hasattr(on_limbs, "__code__")
"""Whether this module runs compiled (mypyc's functions are built-in ones, without Python bytecode)."""
