"""The server's Prometheus metrics (prometheus-client, one registry per app): requests, tokens, latency histograms,
and speculation — nodes drafted and accepted per proposer and per draft position, and the steps the router left
each proposer out."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class ServerMetrics:
    """Counters and histograms of one server (``GET /metrics`` renders them)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specframe_requests", "Requests by endpoint and outcome.", ["endpoint", "status"],
                                registry=r)
        self.prompt_tokens = Counter("specframe_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter("specframe_generation_tokens", "Generated tokens of finished requests.",
                                         registry=r)
        self.forwards = Counter("specframe_target_forwards", "Verification forwards of finished requests (a batched "
                                "forward counts once per request in it).", registry=r)
        self.running = Gauge("specframe_requests_pending", "Requests queued or decoding.", registry=r)
        self.ttft = Histogram("specframe_time_to_first_token_seconds", "From arrival to the first token.",
                              buckets=LATENCY, registry=r)
        self.tpot = Histogram("specframe_time_per_output_token_seconds", "Per token after the first.",
                              buckets=PER_TOKEN, registry=r)
        self.latency = Histogram("specframe_e2e_request_latency_seconds", "From arrival to the last token.",
                                 buckets=LATENCY, registry=r)
        self.drafted = Counter("specframe_drafted_nodes", "Draft nodes verified, by proposer.", ["proposer"],
                               registry=r)
        self.accepted = Counter("specframe_accepted_nodes", "Draft nodes accepted (credited), by proposer.",
                                ["proposer"], registry=r)
        self.by_position_drafted = Counter("specframe_drafted_nodes_by_position", "Draft nodes verified, by depth.",
                                           ["position"], registry=r)
        self.by_position_accepted = Counter("specframe_accepted_nodes_by_position", "Draft nodes accepted, by depth.",
                                            ["position"], registry=r)
        self.skipped = Counter("specframe_router_skipped_steps", "Steps the router left a proposer out.",
                               ["proposer"], registry=r)

    def finished(self, result: Any) -> None:
        """Count one finished request (a :class:`~specframe.decode.engine.GenerationResult`)."""
        m = result.metrics
        self.prompt_tokens.inc(m.prompt_tokens)
        self.generation_tokens.inc(m.new_tokens)
        self.forwards.inc(m.target_forwards)
        ttft = m.queue_s + m.ttft_s
        self.ttft.observe(ttft)
        self.latency.observe(m.queue_s + m.wall_s)
        if m.new_tokens > 1:
            self.tpot.observe(max(0.0, m.wall_s - m.ttft_s) / (m.new_tokens - 1))
        for label, pm in m.proposers.items():
            self.drafted.labels(label).inc(pm.drafted_nodes)
            self.accepted.labels(label).inc(pm.accepted_nodes)
            self.skipped.labels(label).inc(pm.skipped_steps)
        for d, n in enumerate(m.drafted_by_depth, 1):
            self.by_position_drafted.labels(str(d)).inc(n)
        for d, n in enumerate(m.accepted_by_depth, 1):
            self.by_position_accepted.labels(str(d)).inc(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
