"""The hand-off of a request's KV from a prefill worker to a decode worker (``core.kv_transfer``): exact
small cases, and a hypothesis state machine that drives a prefill and a decode scheduler through random
offers, steps and transfers and checks after every move that blocks are conserved on both sides, that
every transferred block is freed on the prefill side and owned on the decode side, and that no request is
lost or duplicated while decode memory is short."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from simulator.core.config import Batching, KVPolicy, Role, SchedulerConfig
from simulator.core.kv_transfer import can_hand_off, needs_decode
from simulator.core.request import RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler

BS = 4


def prefill_worker(num_blocks: int = 32, **knobs: object) -> Scheduler:
    return Scheduler(SchedulerConfig(num_blocks=num_blocks, block_size=BS, role=Role.PREFILL,
                                     max_num_batched_tokens=16, **knobs))  # type: ignore[arg-type]


def decode_worker(num_blocks: int = 32, **knobs: object) -> Scheduler:
    return Scheduler(SchedulerConfig(num_blocks=num_blocks, block_size=BS, role=Role.DECODE,
                                     max_num_batched_tokens=16, **knobs))  # type: ignore[arg-type]


def spec(rid: int, prompt: int = 10, output: int = 5, hashes: tuple[int, ...] = ()) -> RequestSpec:
    return RequestSpec(rid, float(rid), prompt, output, block_hashes=hashes)


def run_to_idle(scheduler: Scheduler) -> list[int]:
    finished = []
    while scheduler.has_work:
        plan = scheduler.schedule()
        finished += [r.request_id for r in scheduler.update(plan)]
    return finished


def references(scheduler: Scheduler) -> Counter[int]:
    """Block references the scheduler's requests hold: tables of running, reserved and held requests."""
    refs: Counter[int] = Counter()
    for blocks in scheduler.kv.req_blocks.values():
        refs.update(blocks)
    return refs


# ----- exact cases ---------------------------------------------------------------------------------------


def test_a_prefill_worker_ends_a_request_at_its_first_token_and_holds_its_blocks() -> None:
    prefill = prefill_worker()
    request = prefill.add_request(spec(0, prompt=10, output=50))
    assert request.max_output_tokens == 1
    assert run_to_idle(prefill) == [0]
    assert request.status is RequestStatus.FINISHED and request.num_output_tokens == 1
    assert prefill.sender is not None and list(prefill.sender.held) == [0]
    assert len(request.block_table) == 3 and prefill.kv.pool.num_used == 3  # held for the transfer
    assert prefill.sender.block_ids(0, 2, skip=1) == request.block_table[1:3]
    prefill.sender.release(0)
    assert prefill.kv.pool.num_used == 0 and not prefill.sender.held


def test_reservations_go_in_order_and_stop_at_the_first_that_does_not_fit() -> None:
    decode = decode_worker(num_blocks=8)
    receiver = decode.receiver
    assert receiver is not None
    for rid, prompt in enumerate((12, 24, 4)):  # 3, 6 and 1 blocks
        receiver.offer(spec(rid, prompt=prompt, output=3))
    # 3 blocks go; 6 more do not fit in the 5 left, and the third, which would, does not jump the queue.
    assert [r.request_id for r in receiver.reserve()] == [0] and decode.kv.num_free_blocks == 5
    assert receiver.num_waited == 2
    assert receiver.reserve() == [] and receiver.num_waited == 2  # each waiting request counted once
    # Nothing is lost while it waits: the decode worker holds all three, waiting for KV.
    assert set(decode.requests) == {0, 1, 2} and decode.num_waiting == 3
    receiver.complete(0)
    run_to_idle(decode)
    assert [r.request_id for r in receiver.reserve()] == [1, 2]
    assert receiver.num_waited == 2


def test_a_reservation_is_the_prompt_blocks_and_skips_the_decode_side_hits() -> None:
    decode = decode_worker()
    receiver = decode.receiver
    assert receiver is not None
    first = spec(0, prompt=12, output=3, hashes=(1, 2, 3))
    receiver.offer(first)
    (reservation,) = receiver.reserve()
    assert reservation.num_hit_blocks == 0 and reservation.num_sent_blocks == 3
    # Reserved blocks are not in the prefix cache until their KV has landed.
    assert decode.kv.pool.cached == {}
    receiver.offer(spec(1, prompt=12, output=3, hashes=(1, 2, 9)))
    (early,) = receiver.reserve()
    assert early.num_hit_blocks == 0
    request = receiver.complete(0, num_cached_tokens=8, num_preemptions=1)
    assert request.status is RequestStatus.RUNNING and request.num_computed_tokens == 12
    assert request.num_output_tokens == 1 and request.num_cached_tokens == 8 and request.num_preemptions == 1
    assert set(decode.kv.pool.cached) == {1, 2, 3}
    receiver.offer(spec(2, prompt=13, output=3, hashes=(1, 2, 7)))
    (late,) = receiver.reserve()
    assert late.num_hit_blocks == 2 and late.num_sent_blocks == 2  # blocks 1, 2 held already; 13 tokens: 4 blocks
    assert late.block_ids[:2] == reservation.block_ids[:2]


def test_a_received_request_decodes_its_remaining_tokens() -> None:
    decode = decode_worker()
    receiver = decode.receiver
    assert receiver is not None
    receiver.offer(spec(0, prompt=10, output=5))
    receiver.reserve()
    assert not decode.has_work  # nothing to run before the KV lands
    receiver.complete(0)
    plans = []
    while decode.has_work:
        plan = decode.schedule()
        plans.append(plan.num_new_tokens)
        decode.update(plan)
    assert plans == [[1], [1], [1], [1]]  # tokens 2..5: every step a decode
    assert decode.kv.num_free_blocks == 32


def test_reservations_wait_for_requests_the_decode_worker_preempted() -> None:
    decode = decode_worker(num_blocks=8)
    receiver = decode.receiver
    assert receiver is not None
    for rid in range(2):
        receiver.offer(spec(rid, prompt=12, output=12))
    receiver.reserve()
    for rid in range(2):
        receiver.complete(rid)
    while not decode.waiting:  # decode until memory runs out and the later request is preempted
        decode.update(decode.schedule())
    receiver.offer(spec(2, prompt=4, output=2))
    assert receiver.reserve() == []  # the preempted request goes back in first
    run_to_idle(decode)
    assert [r.request_id for r in receiver.reserve()] == [2]


def test_reserved_requests_take_sequence_slots() -> None:
    decode = decode_worker(max_num_seqs=2)
    receiver = decode.receiver
    assert receiver is not None
    for rid in range(3):
        receiver.offer(spec(rid))
    assert [r.request_id for r in receiver.reserve()] == [0, 1]
    receiver.complete(0)
    assert receiver.reserve() == []
    run_to_idle(decode)
    assert [r.request_id for r in receiver.reserve()] == [2]


def test_one_token_requests_need_no_decode_worker_and_impossible_pairs_are_refused() -> None:
    assert not needs_decode(spec(0, output=1)) and needs_decode(spec(0, output=2))
    prefill, decode = prefill_worker(max_model_len=64), decode_worker(num_blocks=4, max_model_len=64)
    assert can_hand_off(prefill, decode, spec(0, prompt=10, output=5))
    assert not can_hand_off(prefill, decode, spec(0, prompt=10, output=10))  # 20 tokens: 5 decode blocks
    assert not can_hand_off(prefill_worker(max_model_len=8), decode, spec(0, prompt=8, output=2))


def test_abort_releases_what_an_offer_holds() -> None:
    decode = decode_worker(num_blocks=4)
    receiver = decode.receiver
    assert receiver is not None
    receiver.offer(spec(0, prompt=12))
    receiver.offer(spec(1, prompt=12))
    receiver.reserve()
    decode.abort(1)  # waiting for blocks
    decode.abort(0)  # reserved
    assert not decode.requests and decode.kv.num_free_blocks == 4 and decode.num_receiving == 0
    assert not receiver.pending and not receiver.receiving


@pytest.mark.parametrize("policy", [KVPolicy.RESERVE, KVPolicy.CONTIGUOUS])
def test_a_reservation_follows_the_decode_workers_kv_policy(policy: KVPolicy) -> None:
    decode = decode_worker(num_blocks=32, kv_policy=policy, max_model_len=64)
    receiver = decode.receiver
    assert receiver is not None
    receiver.offer(spec(0, prompt=10, output=10))
    receiver.reserve()
    assert decode.kv.pool.num_used == (5 if policy is KVPolicy.RESERVE else 16)


# ----- random hand-offs --------------------------------------------------------------------------------


class HandOff(RuleBasedStateMachine):
    """A prefill and a decode worker with small pools; requests offered, reserved, prefilled, transferred
    and decoded in random interleavings."""

    def __init__(self) -> None:
        super().__init__()
        self.prefill = prefill_worker(num_blocks=12, enable_prefix_caching=True)
        self.decode = decode_worker(num_blocks=10, max_num_seqs=4, enable_prefix_caching=True)
        self.next_id = 0
        self.offered: set[int] = set()
        self.prompt_of: dict[int, int] = {}
        self.finished: set[int] = set()
        self.transferred: dict[int, list[int]] = {}
        """Each transfer's prefill-side blocks, as they were read."""

    @rule(prompt=st.integers(1, 24), output=st.integers(2, 8), family=st.integers(0, 2))
    def offer(self, prompt: int, output: int, family: int) -> None:
        rid = self.next_id
        self.next_id += 1
        request_spec = RequestSpec(rid, float(rid), prompt, output,
                                   block_hashes=tuple(family * 1000 + i for i in range((prompt + output) // BS)))
        if not can_hand_off(self.prefill, self.decode, request_spec):
            return
        receiver = self.decode.receiver
        assert receiver is not None
        receiver.offer(request_spec)
        self.offered.add(rid)
        self.prompt_of[rid] = prompt

    @rule()
    def reserve(self) -> None:
        receiver = self.decode.receiver
        assert receiver is not None
        for reservation in receiver.reserve():
            request = self.decode.requests[reservation.request_id]
            self.prefill.add_request(request.spec)
            assert len(reservation.block_ids) == -(-reservation.num_prompt_tokens // BS)

    @rule()
    def prefill_step(self) -> None:
        if self.prefill.has_work:
            self.prefill.update(self.prefill.schedule())

    @precondition(lambda self: self.prefill.sender is not None and self.prefill.sender.held)
    @rule(data=st.data())
    def transfer(self, data: st.DataObject) -> None:
        sender, receiver = self.prefill.sender, self.decode.receiver
        assert sender is not None and receiver is not None
        rid = data.draw(st.sampled_from(sorted(sender.held)))
        assert rid in receiver.receiving, "a prefill ran without a decode reservation"
        held = sender.held[rid]
        table = list(held.block_table)
        assert len(table) * BS >= self.prompt_of[rid]
        sender.release(rid)
        # Every transferred block is freed on the prefill side (a cached one may stay, unreferenced)...
        assert all(self.prefill.kv.pool.ref_count(b) == sum(1 for t in self.prefill.kv.req_blocks.values()
                                                            if b in t) for b in table)
        assert rid not in self.prefill.kv.req_blocks
        request = receiver.complete(rid)
        # ... and owned on the decode side: the request's table covers its prompt, every block referenced.
        assert len(request.block_table) * BS >= request.num_prompt_tokens
        assert all(self.decode.kv.pool.ref_count(b) >= 1 for b in request.block_table)
        self.transferred[rid] = table

    @rule()
    def decode_step(self) -> None:
        if self.decode.has_work:
            plan = self.decode.schedule()
            self.finished.update(r.request_id for r in self.decode.update(plan))

    @invariant()
    def blocks_are_conserved_on_both_sides(self) -> None:
        for scheduler in (self.prefill, self.decode):
            pool = scheduler.kv.pool
            assert {b: n for b, n in enumerate(pool.ref_cnt) if n} == dict(references(scheduler))
            assert pool.num_free + len(references(scheduler)) == pool.num_blocks

    @invariant()
    def no_request_is_lost_or_duplicated(self) -> None:
        sender, receiver = self.prefill.sender, self.decode.receiver
        assert sender is not None and receiver is not None
        pending = {r.request_id for r in receiver.pending}
        receiving = set(receiver.receiving)
        decoding = {r.request_id for r in self.decode.running} | {r.request_id for r in self.decode.waiting}
        places = [pending, receiving, decoding, self.finished]
        assert sum(len(p) for p in places) == len(self.offered)
        assert set().union(*places) == self.offered
        # The prefill worker only ever holds reserved requests, each in one place.
        on_prefill = set(self.prefill.requests) | set(sender.held)
        assert on_prefill <= receiving
        assert self.decode.num_receiving == len(receiving)
        assert len(self.decode.running) + len(receiving) <= self.decode.config.max_num_seqs


HandOff.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestHandOff = HandOff.TestCase


def test_every_batching_policy_can_run_a_prefill_worker() -> None:
    for batching in (Batching.CHUNKED, Batching.CONTINUOUS, Batching.STATIC):
        prefill = prefill_worker(batching=batching)
        for rid in range(3):
            prefill.add_request(spec(rid, prompt=9, output=7))
        assert sorted(run_to_idle(prefill)) == [0, 1, 2]
        assert prefill.sender is not None and len(prefill.sender.held) == 3
