"""A disaggregated fleet's request path: a prefill worker and a decode worker per request, the decode
side's reservation, the prefill, the KV on the link, and the decode.

At arrival the fleet picks both workers (``prefill_router`` and ``decode_router``, any routing policy by
name, each over its own side's replicas) and offers the request to the decode worker, whose core reserves
its blocks now or queues it (back-pressure: its prefill does not start while decode memory is short;
``core.kv_transfer``). Once reserved, the request goes to the prefill worker, whose own scheduler runs it
to its first token. Then its KV crosses the link (``cost.link.TransferModel``), one transfer at a time on
each replica's link (a prefill replica's egress and a decode replica's ingress are each a FIFO):

- ``after_prefill``: the transfer starts when the prefill has produced the first token and the link is
  free (vLLM's NIXL connector and SGLang move a request's KV once its prefill is done);
- ``layerwise``: the KV streams layer by layer as each prefill step computes it (Splitwise, Mooncake): the
  link starts carrying it when the request's prefill starts (or when the link frees) and the KV has landed
  at the later of the prefill's end and the link having carried every byte, plus the latency. What is
  left out: the last layer's share of the last step's KV, sent after the prefill ends (1/layers of it).

When the KV has landed the prefill worker frees its blocks and the decode worker takes the request into
its batch. The client sees the first token when the decode worker has it (``first_token: decode``, as
vLLM's and SGLang's routers, which stream from the decode worker, report TTFT) or when the prefill
worker computed it (``first_token: prefill``, as DistServe and Splitwise count it). A request with one
output token is done at the prefill worker. Every arrival ends completed or rejected, or is in flight at a
horizon: none is dropped while it waits.

Every scheduling or KV decision here is the core's; this module routes, prices the link and keeps time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

from simulator.core.kv_transfer import Reservation, can_hand_off, needs_decode
from simulator.core.request import Request, RequestSpec
from simulator.cost.link import TransferModel
from simulator.fleet.clock import Clock
from simulator.fleet.config import DisaggregationConfig, FirstToken, TransferMode
from simulator.fleet.replica import Replica
from simulator.fleet.router import RouterConfig, RouterState, make_router
from simulator.results.handoffs import HandoffLog
from simulator.results.request_log import RequestLog


class Disaggregation:
    """The coordinator of one disaggregated fleet run: the arrival feed's ``dispatch``, the prefill
    workers' ``on_prefilled`` and the decode workers' ``on_step_ended`` (see the module docstring)."""

    def __init__(
        self,
        prefill: Sequence[Replica],
        decode: Sequence[Replica],
        log: RequestLog,
        handoffs: HandoffLog,
        *,
        config: DisaggregationConfig,
        router: RouterConfig,
        transfer: Callable[[Replica, Replica], TransferModel],
        seed: int,
        network_latency_s: float,
    ) -> None:
        if not prefill or not decode:
            raise ValueError("a disaggregated fleet needs prefill and decode replicas")
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.log = log
        self.handoffs = handoffs
        self.config = config
        self.transfer = transfer
        self.network_latency_s = network_latency_s
        self.clock = Clock(prefill[0].env)
        # Each side has its own router and views; randomised policies draw from seeds of their own.
        self._prefill_router = make_router(router.model_copy(update={"policy": config.prefill_router}),
                                           len(self.prefill), seed)
        self._decode_router = make_router(router.model_copy(update={"policy": config.decode_router}),
                                          len(self.decode), seed + 1)
        self._prefill_views = RouterState(self.prefill, router.refresh_s)
        self._decode_views = RouterState(self.decode, router.refresh_s)
        self._specs: dict[int, RequestSpec] = {}
        """Requests offered to a decode worker and not yet reserved."""
        self._prefill_of: dict[int, Replica] = {}
        self._decode_of: dict[int, Replica] = {}
        self._reservations: dict[int, Reservation] = {}
        self._link_free_s: dict[int, float] = {}
        """When each replica's link (a prefill worker's egress, a decode worker's ingress) is next free."""
        self.layerwise = config.transfer is TransferMode.LAYERWISE
        self.first_token_at_prefill = config.first_token is FirstToken.PREFILL
        for replica in self.prefill:
            replica.on_prefilled = self._prefilled
        for replica in self.decode:
            replica.on_step_ended = self._retry

    # ----- arrival: pick both workers, offer to the decode one ---------------------------------------------

    def dispatch(self, spec: RequestSpec, now: float) -> None:
        rid = spec.request_id
        prefill = self.prefill[self._prefill_views.route(self._prefill_router, spec, now)]
        if not needs_decode(spec):  # a one-token answer is done at the prefill worker
            self.log.on_routed(rid, prefill.replica_id)
            prefill.submit(spec)
            return
        decode = self.decode[self._decode_views.route(self._decode_router, spec, now)]
        self.log.on_routed(rid, decode.replica_id)
        if not can_hand_off(prefill.scheduler, decode.scheduler, spec):
            self.log.on_rejected(rid, now)
            return
        self._specs[rid] = spec
        self._prefill_of[rid] = prefill
        self._decode_of[rid] = decode
        self._reserved(decode.offer(spec), now)

    def _retry(self, decode: Replica) -> None:
        """A decode worker's step ended: offers waiting for blocks may fit now."""
        reservations = decode.reserve_offered()
        if reservations:
            self._reserved(reservations, self.clock.now())

    def _reserved(self, reservations: list[Reservation], now: float) -> None:
        """Blocks are reserved: each request's prefill may start."""
        for reservation in reservations:
            rid = reservation.request_id
            prefill = self._prefill_of[rid]
            block_size = prefill.scheduler.block_size
            self._reservations[rid] = reservation
            self.handoffs.on_reserved(rid, now, prefill.replica_id, reservation.num_sent_blocks * block_size,
                                      reservation.num_hit_blocks * block_size)
            prefill.submit(self._specs.pop(rid))

    # ----- the prefill produced the first token: the KV moves ---------------------------------------------

    def _prefilled(self, prefill: Replica, finished: list[Request], now: float) -> None:
        delivered = now + self.network_latency_s
        for request in finished:
            rid = request.request_id
            decode = self._decode_of.get(rid)
            if decode is None:  # it needed no decode worker: done
                prefill.release(rid)
                self.log.on_finish(rid, delivered, request.num_cached_tokens, request.num_preemptions,
                                   request.num_output_tokens)
                continue
            self.handoffs.on_prefilled(rid, now)
            if self.first_token_at_prefill:
                self.log.on_first_token(rid, delivered)
            reservation = self._reservations.pop(rid)
            model = self.transfer(prefill, decode)
            num_tokens = reservation.num_sent_blocks * prefill.scheduler.block_size
            wire_s = model.wire_s(num_tokens)
            link_free = max(self._link_free_s.get(prefill.replica_id, -math.inf),
                            self._link_free_s.get(decode.replica_id, -math.inf))
            if self.layerwise:
                began = float(self.log.first_scheduled_s[rid])  # the prefill's first step: streaming starts
                start = max(began, link_free)
                busy_until = max(start + wire_s, now)
            else:
                start = max(now, link_free)
                busy_until = start + wire_s
            self._link_free_s[prefill.replica_id] = self._link_free_s[decode.replica_id] = busy_until
            landed = busy_until + model.latency_s
            self.handoffs.on_transfer(rid, start, landed, model.num_bytes(num_tokens))
            self.clock.at(landed, [partial(self._landed, rid)])

    def _landed(self, rid: int, event: object) -> None:
        """The KV is in the decode worker's blocks: the prefill worker frees its copy, the decode continues."""
        prefill = self._prefill_of.pop(rid)
        decode = self._decode_of.pop(rid)
        done = prefill.release(rid)
        decode.receive(rid, done.num_cached_tokens, done.num_preemptions)
        if not self.first_token_at_prefill:
            self.log.on_first_token(rid, self.clock.now() + self.network_latency_s)

    # ----- what a run reports -----------------------------------------------------------------------------

    @property
    def num_waited(self) -> int:
        """Requests the decode workers could not reserve at once (each counted once)."""
        return sum(replica.scheduler.receiver.num_waited for replica in self.decode
                   if replica.scheduler.receiver is not None)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for a reservation now."""
        return sum(len(replica.scheduler.receiver.pending) for replica in self.decode
                   if replica.scheduler.receiver is not None)
