"""A prefill engine and a decode engine in one process: the disaggregated request path on the real model.

Each request is offered to the decode engine, whose scheduler reserves the blocks its prompt KV will land
in (its own prefix-cache hits among them); once reserved, the prefill engine runs it to its first token
with its own scheduler (chunked or not, its own prefix cache); then the prompt's KV is copied from the
prefill engine's pool into the reserved blocks (``KVCache.copy_blocks_to``: the block table remapped, the
decode side's hits not copied), the prefill engine frees its blocks, and the decode engine takes the
request, with its first token, into its batch. Every decision (reservation, hold, release, landing) is
the shared core's (``simulator.core.kv_transfer``), exactly as the simulator runs it; the pair only
moves tensors and token ids, and records what each copy cost (``CopyRecord``), which is the in-process
link of ``calibration/links.yaml``.

The two engines step in turn (prefill, copies, decode), in one thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from calibration.engine.engine import Engine
from simulator.core.config import Role
from simulator.core.kv_transfer import KVReceiver, KVSender, Reservation, can_hand_off, needs_decode
from simulator.core.request import RequestSpec, RequestStatus


@dataclass(frozen=True, slots=True)
class CopyRecord:
    """One request's KV copied from the prefill engine's pool to the decode engine's."""

    request_id: int
    num_blocks: int
    num_bytes: int
    seconds: float
    """Wall clock of the copy (synchronised on a GPU)."""


class EnginePair:
    """A prefill engine and a decode engine serving requests together (see the module docstring)."""

    def __init__(self, prefill: Engine, decode: Engine, *, clock: Callable[[], float] = time.perf_counter) -> None:
        if prefill.config.role is not Role.PREFILL or decode.config.role is not Role.DECODE:
            raise ValueError("an engine pair is a prefill-role engine and a decode-role engine")
        p_cache, d_cache = prefill.runner.kv_cache, decode.runner.kv_cache
        if prefill.config.block_size != decode.config.block_size or p_cache.pool.shape[:2] != d_cache.pool.shape[:2] \
                or p_cache.pool.shape[3:] != d_cache.pool.shape[3:] or p_cache.dtype != d_cache.dtype:
            raise ValueError("the prefill and decode engines must hold the same model's KV in the same blocks")
        if prefill.seed != decode.seed or prefill.shape != decode.shape:
            raise ValueError("the prefill and decode engines must run the same model with the same weights "
                             "(the same shape and seed)")
        self.prefill = prefill
        self.decode = decode
        self._clock = clock
        self.copies: list[CopyRecord] = []
        self._prompts: dict[int, list[int]] = {}
        """Prompt ids of offered requests not yet reserved (the prefill engine gets the very same ids)."""
        self._specs: dict[int, RequestSpec] = {}
        self._reservations: dict[int, Reservation] = {}
        self._single: set[int] = set()
        """Requests with one output token: served by the prefill engine alone."""

    @property
    def sender(self) -> KVSender:
        sender = self.prefill.scheduler.sender
        assert sender is not None  # a prefill-role scheduler always has one
        return sender

    @property
    def receiver(self) -> KVReceiver:
        receiver = self.decode.scheduler.receiver
        assert receiver is not None  # a decode-role scheduler always has one
        return receiver

    def add_request(self, spec: RequestSpec, prompt_token_ids: Sequence[int] | None = None) -> RequestStatus:
        """Offer a request to the pair; REJECTED when the two engines could never serve it between them."""
        rid = spec.request_id
        if not needs_decode(spec):
            self._single.add(rid)
            return self.prefill.add_request(spec, prompt_token_ids).status
        if not can_hand_off(self.prefill.scheduler, self.decode.scheduler, spec):
            return RequestStatus.REJECTED
        request = self.decode.offer(spec, prompt_token_ids)
        self._prompts[rid] = list(self.decode.token_ids[rid])
        self._specs[rid] = request.spec
        return request.status

    @property
    def has_work(self) -> bool:
        return (self.prefill.has_work or self.decode.has_work or bool(self.sender.held)
                or bool(self.receiver.pending) or bool(self.receiver.receiving))

    def step(self) -> None:
        """Reserve what fits, run one prefill step, copy what it finished, run one decode step."""
        for reservation in self.receiver.reserve():
            rid = reservation.request_id
            self._reservations[rid] = reservation
            self.prefill.add_request(self._specs.pop(rid), self._prompts.pop(rid))
        if self.prefill.has_work:
            self.prefill.step()
        for rid in sorted(self.sender.held):
            if rid in self._single:
                self.sender.release(rid)
                continue
            self._transfer(rid)
        if self.decode.has_work:
            self.decode.step()

    def _transfer(self, rid: int) -> None:
        reservation = self._reservations.pop(rid)
        skip, count = reservation.num_hit_blocks, reservation.num_sent_blocks
        source = self.sender.block_ids(rid, count, skip)
        start = self._clock()
        self.prefill.runner.kv_cache.copy_blocks_to(self.decode.runner.kv_cache, source,
                                                    reservation.block_ids[skip:])
        if self.decode.runner.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.decode.runner.device)
        seconds = self._clock() - start
        cache = self.prefill.runner.kv_cache
        self.copies.append(CopyRecord(rid, count, count * cache.pool[:, :, 0].numel() * cache.pool.element_size(),
                                      seconds))
        done = self.sender.release(rid)
        self.decode.receive(rid, self.prefill.outputs[rid][0], num_cached_tokens=done.num_cached_tokens,
                            num_preemptions=done.num_preemptions)

    def run(self, max_steps: int = 100_000) -> None:
        """Step until every offered request has finished."""
        for _ in range(max_steps):
            if not self.has_work:
                return
            self.step()
        raise RuntimeError(f"the engine pair did not finish in {max_steps} steps")

    def outputs(self, request_id: int) -> list[int]:
        """The tokens generated for a request: its first from the prefill engine, the rest from the decode."""
        if request_id in self._single:
            return list(self.prefill.outputs[request_id])
        return list(self.decode.outputs[request_id])
