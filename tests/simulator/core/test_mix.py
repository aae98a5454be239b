"""``core.mix.splitmix64`` computes the 64-bit products on 16-bit limbs compiled and on big ints interpreted:
both must equal the plain formula on Python ints bit for bit, for every integer (taken modulo 2**64), negative
and wider ones too."""

from hypothesis import given
from hypothesis import strategies as st

from simulator.core import mix
from simulator.core.mix import MASK64, add_halves, mix_halves, on_big_ints, on_limbs, splitmix64, times


def plain_splitmix64(value: int) -> int:
    z = (value + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


@given(st.one_of(st.integers(0, MASK64), st.integers(-(1 << 70), 1 << 70)))
def test_the_limb_mix_is_the_plain_formula(value: int) -> None:
    assert on_limbs(value) == on_big_ints(value) == splitmix64(value) == plain_splitmix64(value)


def test_each_build_takes_its_fast_way() -> None:
    from simulator import native

    assert native.active() == mix.COMPILED


def test_known_values_and_edges() -> None:
    assert splitmix64(0) == 0xE220A8397B1DCDAF  # SplitMix64's first output from seed 0
    for value in (1, MASK64, 1 << 63, (1 << 32) - 1, 1 << 32, -1):
        assert on_limbs(value) == on_big_ints(value) == splitmix64(value) == plain_splitmix64(value)
        assert 0 <= splitmix64(value) <= MASK64


halves = st.tuples(st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF))


@given(halves, st.one_of(st.integers(0, MASK64), st.integers(-(1 << 70), 1 << 70)))
def test_the_halves_helpers_are_64_bit_arithmetic(value: tuple[int, int], other: int) -> None:
    """``add_halves``, ``times`` and ``mix_halves`` (a chain of mixes on machine integers, compiled) are the
    64-bit sum, product and mix of the value the halves make, as halves."""
    high, low = value
    z = (high << 32) | low

    def joined(pair: tuple[int, int]) -> int:
        assert 0 <= pair[0] <= 0xFFFFFFFF and 0 <= pair[1] <= 0xFFFFFFFF
        return (pair[0] << 32) | pair[1]

    assert joined(add_halves(high, low, other)) == (z + other) & MASK64
    assert joined(times(high, low, 0xBF58, 0x476D, 0x1CE4, 0xE5B9)) == (z * 0xBF58476D1CE4E5B9) & MASK64
    assert joined(mix_halves(high, low)) == plain_splitmix64(z)
