"""The ``workload:`` section of a scenario: limits, arrivals, lengths, shared system prompts, sessions,
or a trace replay, with the rules that tie them together checked at load."""

from typing import Self

from pydantic import Field, model_validator

from simulator.workload.arrival import ArrivalConfig
from simulator.workload.lengths import LengthConfig
from simulator.workload.section import Section
from simulator.workload.traces import MAX_TOKENS, TraceFormat


class SystemPromptPool(Section):
    """Shared prompt prefixes (system prompts, few-shot templates): what a prefix cache can reuse.

    Each request (or each session, once, at its start) draws one; its blocks hash equally everywhere.
    """

    num_prompts: int = Field(ge=1, le=1_000_000)
    """How many distinct system prompts exist (at most a million: the draw weighs every one, and a billion
    took all memory)."""
    tokens: int = Field(ge=1, le=MAX_TOKENS)
    """Length of every system prompt in tokens; added in front of the user tokens."""
    zipf_exponent: float = Field(default=0.0, ge=0)
    """Popularity skew: prompt i is drawn with weight 1 / (i + 1)**s; 0 (default) draws them uniformly."""


class SessionConfig(Section):
    """Multi-turn chat: each turn's prompt is the whole conversation so far plus new user tokens.

    Turn k + 1's prompt = system prompt + every earlier turn's user tokens and answer + new user tokens
    (top-level prompt_tokens draws the new user tokens, output_tokens each answer). Its block hashes extend
    turn k's prompt-and-answer hashes, so a prefix cache sees the history. The next turn arrives
    ``response_time_estimate_s`` + Exp(``think_time_s``) after the previous turn's arrival (open loop).
    """

    turns: LengthConfig
    """Number of turns per session (a length distribution; values are turns, >= 1)."""
    think_time_s: float = Field(ge=0)
    """Mean user think time between reading an answer and sending the next turn, seconds (exponential)."""
    response_time_estimate_s: float = Field(ge=0)
    """Fixed stand-in for the time to produce an answer, seconds; the simulator's real latency is not fed
    back (that would need a closed loop)."""
    max_context_tokens: int = Field(default=8192, ge=2)
    """A session ends before a turn whose prompt plus answer would exceed this (a chat UI starts a new
    conversation); 8192 is Llama-3-8B's context length, the model fleetsim calibrates first."""


class TraceConfig(Section):
    """Replay a real trace: its rows become the requests, in arrival order."""

    format: TraceFormat
    """azure (timestamps + lengths), mooncake (timestamps, lengths, prefix block ids) or vidur (lengths
    only: arrivals then come from the workload's arrival process)."""
    path: str
    """Trace file; relative to the scenario file's folder, or ``${traces}/<file>`` for a public trace:
    $FLEETSIM_TRACES if set, else ``<repo>/../shared/data/traces``, else the cache folder
    ``fleetsim traces --download`` fills (``workload/trace_sources.py``)."""
    time_scale: float | None = Field(default=None, gt=0)
    """Multiply every arrival time (and so every gap) by this; 0.5 doubles the load. None = as recorded."""
    rate_rps: float | None = Field(default=None, gt=0)
    """Rescale arrival times so the mean rate of the rows from start_s to the trace's end is this,
    requests per second (before num_requests and duration_s cut it); exclusive with time_scale."""
    start_s: float = Field(default=0.0, ge=0)
    """Skip the trace's first start_s seconds; the rest is shifted so that start_s becomes time 0."""
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    """Truncate longer prompts to this (a model's context may be shorter than the trace's); None = keep."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Truncate longer answers to this; None = keep."""

    @model_validator(mode="after")
    def _check_scaling(self) -> Self:
        if self.time_scale is not None and self.rate_rps is not None:
            raise ValueError("give time_scale or rate_rps, not both")
        return self


class WorkloadConfig(Section):
    """The ``workload:`` section of a scenario."""

    num_requests: int | None = Field(default=None, ge=1)
    """Stop after this many requests; None = no limit (then duration_s, or the trace's end, stops)."""
    duration_s: float | None = Field(default=None, gt=0)
    """Stop generating arrivals at this time, seconds; whichever of the two limits comes first wins."""
    arrival: ArrivalConfig | None = None
    """How requests (or, with sessions, new sessions) arrive; with a timestamped trace it replaces the
    trace's timestamps."""
    prompt_tokens: LengthConfig | None = None
    """Prompt length (user tokens, after any system prompt) of synthetic requests."""
    output_tokens: LengthConfig | None = None
    """Output length of synthetic requests; the engine generates exactly this many tokens."""
    system_prompts: SystemPromptPool | None = None
    """Shared prefixes drawn per request (or per session); None = nothing is shared between requests."""
    sessions: SessionConfig | None = None
    """Multi-turn conversations; None = every request is independent."""
    trace: TraceConfig | None = None
    """Replay a trace instead of drawing synthetic lengths."""

    @model_validator(mode="after")
    def _check_sources(self) -> Self:
        if self.trace is None:
            missing = [n for n in ("arrival", "prompt_tokens", "output_tokens") if getattr(self, n) is None]
            if missing:
                raise ValueError(f"a synthetic workload needs {missing} (or give a trace)")
            if self.num_requests is None and self.duration_s is None:
                raise ValueError("give num_requests or duration_s (or both) so the workload ends")
            if self.sessions is not None and self.system_prompts is not None \
                    and self.system_prompts.tokens + 2 > self.sessions.max_context_tokens:
                # (a turn is at least its system prompt, one prompt token and one answer token)
                raise ValueError(
                    f"system_prompts.tokens ({self.system_prompts.tokens}) leaves no room for a turn under "
                    f"sessions.max_context_tokens ({self.sessions.max_context_tokens}, Llama-3-8B's context "
                    "unless set): raise max_context_tokens or shorten the system prompts")
            return self
        extra = [n for n in ("prompt_tokens", "output_tokens", "system_prompts", "sessions") if getattr(self, n)]
        if extra:
            raise ValueError(f"a trace replay takes its lengths from the trace; remove {extra}")
        uses_trace_times = self.trace.format is not TraceFormat.VIDUR and self.arrival is None
        if self.trace.format is TraceFormat.VIDUR and self.arrival is None:
            raise ValueError("a vidur trace has no timestamps: give an arrival process")
        if not uses_trace_times and (self.trace.time_scale or self.trace.rate_rps or self.trace.start_s):
            raise ValueError("trace time_scale, rate_rps and start_s apply to the trace's own timestamps only")
        return self
