"""Private hash tails: a spec may give its own blocks' hashes as a rule instead of values. Deriving them gives
exactly the workload's values, once; a request holds only the values until something reads the rest."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.core.request import HashTail, Request, RequestSpec, splitmix64
from simulator.workload.block_keys import mix_into
from simulator.workload.config import WorkloadConfig
from simulator.workload.generate import generate
from simulator.workload.shared_hashes import StreamTail

U64 = st.integers(0, (1 << 64) - 1)


@given(st.lists(U64, min_size=1, max_size=50))
def test_splitmix64_is_the_workloads_numpy_mix_bit_for_bit(values: list[int]) -> None:
    mixed = mix_into(np.array(values, dtype=np.uint64)).tolist()
    assert [splitmix64(v) for v in values] == mixed


def _specs() -> tuple[RequestSpec, RequestSpec]:
    """One request as values and as values plus a tail, with the same hashes."""
    key = 7 << 32
    shared = (11, 12)
    tail = HashTail(key, 2, 6)
    values = shared + tuple(splitmix64(key ^ j) for j in range(2, 6))
    return (RequestSpec(3, 0.5, 90, 10, values, private_from=2),
            RequestSpec(3, 0.5, 90, 10, shared, private_from=2, hash_tail=tail))


def test_a_tail_is_derived_once_and_equals_the_values() -> None:
    eager, lazy = _specs()
    assert lazy.known_hashes == (11, 12)
    assert lazy.num_hashed_blocks == eager.num_hashed_blocks == 6
    assert lazy == eager  # equality reads every hash
    assert lazy.known_hashes == eager.block_hashes, "deriving keeps the values"
    assert lazy.block_hashes is lazy.block_hashes
    assert lazy.with_hashes((1, 2)).block_hashes == (1, 2)


def test_a_request_holds_the_values_until_it_exposes_its_tail() -> None:
    _, spec = _specs()
    request = Request(spec)
    assert request.block_hashes == (11, 12) and request.num_hashed_blocks == 6
    assert request.block_hashes is spec.known_hashes  # the spec's own tuple: no copy per request
    request.expose_hashes()
    assert request.block_hashes is spec.block_hashes and len(request.block_hashes) == 6
    # The spec keeps what was derived: a later life of the request (a retry) holds every value at once.
    assert Request(spec).block_hashes == request.block_hashes


@pytest.mark.parametrize(("given_hashes", "private_from", "tail"), [
    ((1, 2), None, HashTail(5, 2, 4)),  # a tail needs private_from
    ((1, 2), 2, HashTail(5, 3, 4)),  # a tail starts where the values end
    ((1, 2), 3, HashTail(5, 2, 4)),  # ... at or past private_from
])
def test_inconsistent_tails_are_refused(given_hashes: tuple[int, ...], private_from: int | None,
                                        tail: HashTail) -> None:
    with pytest.raises(ValueError, match="tail"):
        RequestSpec(0, 0.0, 64, 8, given_hashes, private_from=private_from, hash_tail=tail)
    with pytest.raises(ValueError, match="start <= stop"):
        HashTail(0, 3, 2)


@pytest.mark.parametrize("shape", ["chat", "chat+system", "sessions+system"])
def test_workload_specs_carry_tails_that_derive_the_eager_hashes(shape: str) -> None:
    fields: dict = {"num_requests": 400, "arrival": {"process": "poisson", "rate_rps": 5.0},
                    "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 3000},
                    "output_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.8, "max": 800}}
    if "system" in shape:
        fields["system_prompts"] = {"num_prompts": 3, "tokens": 100}
    if shape.startswith("sessions"):
        fields["sessions"] = {"turns": {"dist": "uniform", "low": 1, "high": 4}, "think_time_s": 1,
                              "response_time_estimate_s": 1}
    workload = generate(WorkloadConfig.model_validate(fields), seed=5, block_size=16)
    specs = workload.specs()
    known = {s.request_id: len(s.known_hashes) for s in specs if len(s.known_hashes) < s.num_hashed_blocks}
    assert known, "no spec has a tail: the test would prove nothing"
    for spec in specs:
        if spec.request_id in known:
            assert spec.private_from == known[spec.request_id]
        assert spec.block_hashes == workload.block_hashes(spec.request_id)


@given(key=st.integers(0, (1 << 31) - 1).map(lambda k: k << 32), start=st.integers(0, 40), size=st.integers(0, 60))
def test_a_stream_tail_derives_the_hash_tails_values_bit_for_bit(key: int, start: int, size: int) -> None:
    assert StreamTail(key, start, start + size).values() == HashTail(key, start, start + size).values()


def test_a_tail_past_a_chains_first_block_is_accepted_and_may_be_cached_up_to_private_from() -> None:
    key = 9 << 32
    values = (1, 2, 3, *tuple(splitmix64(key ^ j) for j in range(3, 8)))
    turn = RequestSpec(0, 0.0, 128, 8, (1, 2, 3), chain_from=2, hash_tail=HashTail(key, 3, 8))
    assert turn.num_lookup_blocks == 8, "a session's chained blocks may be cached by its earlier turns"
    last = RequestSpec(1, 0.0, 128, 8, (1, 2, 3), chain_from=2, private_from=6, hash_tail=HashTail(key, 3, 8))
    assert last.num_lookup_blocks == 6, "no cache holds a private hash nobody derived"
    assert turn.block_hashes == last.block_hashes == values and last.num_lookup_blocks == 8
    with pytest.raises(ValueError, match="tail"):
        RequestSpec(2, 0.0, 128, 8, (1, 2), chain_from=2, hash_tail=HashTail(key, 2, 8))  # at the chain's first
