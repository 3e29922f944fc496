"""`GET /metrics`: Prometheus text under Friendli Container's own metric names, so its
published Grafana dashboards work unchanged, plus amity's KV-cache and latency series.

Counters are read through a collector rather than `prometheus_client.Counter`, because
the client library would rename `friendli_failure_by_cancel` to `..._total`; the
Python client's `Summary` has no quantiles, so latency summaries keep a window of
recent observations and report quantiles over it.
"""

import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

import amity

QUANTILES = (0.5, 0.9, 0.95, 0.99)
LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class _Window:
    def __init__(self, size: int = 2048):
        self.values: deque[float] = deque(maxlen=size)
        self.count = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.values.append(v)
        self.count += 1
        self.sum += v

    def metric(self, name: str, doc: str) -> Metric:
        m = Metric(name, doc, "summary")
        ordered = sorted(self.values)
        for q in QUANTILES:
            if ordered:
                m.add_sample(name, {"quantile": str(q)}, ordered[min(len(ordered) - 1, int(q * len(ordered)))])
        m.add_sample(name + "_count", {}, self.count)
        m.add_sample(name + "_sum", {}, self.sum)
        return m


@dataclass
class _Counts:
    requests: int = 0
    responses: int = 0
    items: int = 0
    cancel: int = 0
    timeout: int = 0
    nan_error: int = 0
    reject: int = 0
    error: int = 0
    current_requests: int = 0


class ServerMetrics:
    def __init__(self, engine_stats):
        self.engine_stats = engine_stats  # () -> dict, or None before the model is loaded
        self.registry = CollectorRegistry()
        self.counts = _Counts()
        self.latency = _Window()
        self.queueing = _Window()
        self.ttft = _Window()
        self.itl = _Window()
        self.input_lengths = Histogram(
            "friendli_input_lengths", "Prompt tokens per request.", buckets=LENGTH_BUCKETS,
            registry=self.registry)
        self.output_lengths = Histogram(
            "friendli_output_lengths", "Generated tokens per request.", buckets=LENGTH_BUCKETS,
            registry=self.registry)
        self.tcache_hit_ratio = Histogram(
            "friendli_tcache_hit_ratio", "Share of each prompt served from the prefix cache.",
            buckets=RATIO_BUCKETS, registry=self.registry)
        self.registry.register(self)

    def track(self, num_items: int) -> "RequestTracker":
        self.counts.requests += 1
        self.counts.items += num_items
        self.counts.current_requests += 1
        return RequestTracker(self)

    def reject(self) -> None:
        """A request refused before it reached the engine (queue full)."""
        self.counts.requests += 1
        self.counts.reject += 1

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self):
        c = self.counts
        for name, value, doc in (
            ("friendli_requests_total", c.requests, "Generation requests received."),
            ("friendli_responses_total", c.responses, "Generation requests answered in full."),
            ("friendli_items_total", c.items, "Sequences (choices) requested."),
            ("friendli_failure_by_cancel", c.cancel, "Requests the client abandoned."),
            ("friendli_failure_by_timeout", c.timeout, "Requests that timed out."),
            ("friendli_failure_by_nan_error", c.nan_error, "Requests failed by NaN logits."),
            ("friendli_failure_by_reject", c.reject, "Requests refused: queue full."),
            # amity's own: Friendli has no counter for a failure of the server itself.
            ("amity_failure_by_error", c.error,
             "Requests failed by the server or engine (a step that raised, an engine that "
             "stopped, a shutdown that cut them off)."),
        ):
            # The failure counters have no `_total` (Friendli's names); typed "counter",
            # Prometheus would expect one, so they go out untyped under their exact names.
            if name.endswith("_total"):
                m = Metric(name.removesuffix("_total"), doc, "counter")
            else:
                m = Metric(name, doc, "unknown")
            m.add_sample(name, {}, value)
            yield m
        yield GaugeMetricFamily("friendli_current_requests",
                                 "Requests in flight (admitted, not finished: what --max-queue-len bounds).", c.current_requests)
        stats = self.engine_stats() if self.engine_stats else None
        if stats:
            running, waiting = stats.get("num_running", 0), stats.get("num_waiting", 0)
            total, free = stats.get("num_total_blocks", 0), stats.get("num_free_blocks", 0)
            for name, value, doc in (
                ("friendli_current_items", running + waiting, "Sequences in the engine."),
                ("friendli_current_assigned_items", running, "Sequences being generated."),
                ("friendli_current_waiting_items", waiting, "Sequences waiting for a slot."),
                ("amity_kv_blocks_total", total, "KV cache blocks."),
                ("amity_kv_blocks_used", total - free, "KV cache blocks in use."),
                ("amity_kv_blocks_cached", stats.get("num_cached_blocks", 0),
                 "Free KV blocks still holding a reusable prefix."),
                ("amity_prefix_cache_hit_rate", stats.get("prefix_cache_hit_rate", 0.0),
                 "Share of prompt tokens served from the prefix cache."),
                ("amity_compile_state", stats.get("compile_state", 0),
                 "--compile: 0 eager, 1 compiling in the background (serving eagerly), "
                 "2 compiled, 3 the compile failed (serving eagerly)."),
            ):
                yield GaugeMetricFamily(name, doc, value)
        info = GaugeMetricFamily("friendli_engine_version", "Engine version.", labels=["version"])
        info.add_metric([amity.__version__], 1)
        yield info
        yield self.latency.metric("friendli_requests_latencies", "Seconds from arrival to last token.")
        yield self.queueing.metric(
            "friendli_requests_queueing_delays",
            "Seconds from arrival until the engine first schedules the request (or it leaves "
            "the queue unscheduled).")
        yield self.ttft.metric("friendli_requests_ttft", "Seconds from arrival to first token.")
        yield self.itl.metric("amity_inter_token_latency", "Seconds between a choice's tokens.")


@dataclass
class RequestTracker:
    metrics: ServerMetrics
    arrived: float = field(default_factory=time.perf_counter)
    _last_token: float | None = None
    _submitted: float | None = None
    _dequeued: bool = False
    _closed: bool = False

    def submitted(self) -> None:
        self._submitted = time.perf_counter()

    def scheduled(self, engine_queued_seconds: float) -> None:
        """The engine scheduled the request after it waited that long in its queue."""
        if self._submitted is not None:
            self._leave_queue(self._submitted - self.arrived + engine_queued_seconds)

    def _leave_queue(self, queued_seconds: float) -> None:
        if not self._dequeued and self._submitted is not None:
            self._dequeued = True
            self.metrics.queueing.observe(queued_seconds)

    def tokens(self, count: int) -> None:
        now = time.perf_counter()
        if self._last_token is None:
            self.metrics.ttft.observe(now - self.arrived)
        elif count:
            self.metrics.itl.observe((now - self._last_token) / count)
        self._last_token = now

    def finished(self, prompt_tokens: int, output_tokens: int, cached_tokens: int) -> None:
        if self._close():
            m = self.metrics
            m.counts.responses += 1
            m.latency.observe(time.perf_counter() - self.arrived)
            m.input_lengths.observe(prompt_tokens)
            m.output_lengths.observe(output_tokens)
            m.tcache_hit_ratio.observe(cached_tokens / prompt_tokens if prompt_tokens else 0.0)

    def completed(self) -> None:
        """Answered in full, with no tokens to count (an image)."""
        if self._close():
            self.metrics.counts.responses += 1
            self.metrics.latency.observe(time.perf_counter() - self.arrived)

    def cancelled(self) -> None:
        if self._close():
            self.metrics.counts.cancel += 1
            self._leave_queue(time.perf_counter() - self.arrived)  # if it hung up while queued

    def invalid(self) -> None:
        """The engine refused it as bad input: none of the failure counters."""
        self._close()

    def errored(self) -> None:
        if self._close():
            self.metrics.counts.error += 1

    def _close(self) -> bool:
        if self._closed:
            return False
        self._closed = True
        self.metrics.counts.current_requests -= 1
        return True
