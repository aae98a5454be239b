"""Two KV managers driven alike, request pair by request pair: what the state machines of ``test_kv_private``
(private blocks) and ``test_kv_chains`` (chained blocks) share. Each pair is one request as the economical
manager sees it and as the reference (every block indexed) does; every operation must answer alike on both.
The machines add how requests arrive and are admitted, and what they check."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from simulator.core.kv_manager import KVManager
from simulator.core.request import Request

Pair = tuple[Request, Request]
"""A request as the economical manager sees it, and as the reference does."""


class TwinKVMachine(RuleBasedStateMachine):
    """Running requests compute, produce, finish and are preempted on both managers (``twins``: economical,
    reference); a subclass's ``initialize`` sets ``twins``, ``running`` and ``waiting``."""

    twins: tuple[KVManager, KVManager]
    running: dict[int, Pair]
    waiting: dict[int, Pair]

    @precondition(lambda self: self.running)
    @rule(data=st.data(), n=st.integers(1, 12))
    def step(self, data: st.DataObject, n: int) -> None:
        """Compute up to n tokens, or produce one (a decode); the last one finishes the request, at once (as a
        scheduler does: a request with all its outputs is never preempted)."""
        pair = self.running[data.draw(st.sampled_from(sorted(self.running)))]
        ref = pair[1]
        if ref.num_computed_tokens < ref.num_tokens:
            self._compute(pair, min(n, ref.num_tokens - ref.num_computed_tokens))
            return
        self._produce(pair)

    def _compute(self, pair: Pair, n: int) -> bool:
        """Compute n tokens of a request on both managers; False where the blocks ran out (on both)."""
        ref = pair[1]
        if n == 1 and ref.block_table and self.twins[1].pool.num_free:
            # A decode token as a decode run appends it (a fresh block when it starts one).
            for kv, request in zip(self.twins, pair, strict=True):
                kv.append_decode_token(request, request.num_computed_tokens, request.num_tokens)
                request.num_computed_tokens += 1
            return True
        fresh = [kv.allocate(r, n) for kv, r in zip(self.twins, pair, strict=True)]
        assert fresh[0] == fresh[1]
        if fresh[1] is None:
            return False
        for request in pair:
            request.num_computed_tokens += n
        return True

    def _produce(self, pair: Pair) -> None:
        """One output token of a request with all its tokens computed; the last one finishes it, at once."""
        ref = pair[1]
        for request in pair:
            request.num_output_tokens += 1
        if ref.num_output_tokens == ref.max_output_tokens:
            del self.running[ref.request_id]
            self._finishing(pair)
            for kv, request in zip(self.twins, pair, strict=True):
                kv.free(request)

    def _finishing(self, pair: Pair) -> None:
        """Called as a request finishes, before the managers free it (a machine counts what it reaches)."""

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """Run a request to its end, one decode token at a time, while the blocks last (without this rule
        requests rarely finish)."""
        pair = self.running[data.draw(st.sampled_from(sorted(self.running)))]
        while pair[1].request_id in self.running:
            ref = pair[1]
            if ref.num_computed_tokens < ref.num_tokens:
                if not self._compute(pair, ref.num_tokens - ref.num_computed_tokens):
                    return
            else:
                self._produce(pair)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        pair = self.running.pop(data.draw(st.sampled_from(sorted(self.running))))
        for kv, request in zip(self.twins, pair, strict=True):
            kv.free(request)
            request.num_computed_tokens = 0
        self.waiting[pair[1].request_id] = pair
