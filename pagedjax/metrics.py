"""Prometheus metrics of a running engine (served at ``/metrics``).

Names follow vLLM's with a ``pagedjax:`` prefix. Gauges are refreshed by the
engine thread after every step, add and abort (it alone touches the engine),
so scraping never reads scheduler state from another thread. Each server
gets its own registry, so several engines can live in one process (tests).
"""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401 - re-exported

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0, 160.0)
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                 2.5, 5.0)


class EngineMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        lbl = ["model_name"]
        self.model_name = model_name

        def g(name, doc):
            return Gauge(name, doc, lbl, registry=r).labels(model_name)

        def c(name, doc):
            return Counter(name, doc, lbl, registry=r).labels(model_name)

        def h(name, doc, buckets):
            return Histogram(name, doc, lbl, buckets=buckets, registry=r).labels(model_name)

        self.running = g("pagedjax:num_requests_running", "Requests in the running batch.")
        self.waiting = g("pagedjax:num_requests_waiting", "Requests waiting to be scheduled.")
        self.in_flight = g("pagedjax:num_requests_in_flight",
                           "HTTP-submitted engine requests not yet finished or aborted.")
        self.kv_usage = g("pagedjax:kv_cache_usage_perc",
                          "Fraction of KV pages in use (1 = full).")
        self.pages_total = g("pagedjax:kv_pages_total", "Usable KV pages.")
        self.pages_held = g("pagedjax:kv_pages_held",
                            "KV pages currently held by requests (ref count >= 1).")
        self.pages_cached = g("pagedjax:kv_pages_cached",
                              "Free KV pages that still hold reusable prefix content.")
        self.prefix_hit_rate = g("pagedjax:prefix_cache_hit_rate",
                                 "Prefix-cache hit tokens / queried tokens since start.")
        self.prefix_queries = g("pagedjax:prefix_cache_queries",
                                "Prompt tokens looked up in the prefix cache since start.")
        self.prefix_hits = g("pagedjax:prefix_cache_hits",
                             "Prompt tokens found in the prefix cache since start.")
        self.prompt_tokens = c("pagedjax:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = c("pagedjax:generation_tokens", "Tokens generated.")
        self.steps = c("pagedjax:engine_steps", "Engine steps run.")
        self.compilations = g("pagedjax:xla_compilations",
                              "XLA compilations in this process since start (new step shapes).")
        self.engine_errors = c("pagedjax:engine_errors",
                               "Exceptions caught in the engine thread.")
        self.success = Counter("pagedjax:request_success", "Finished requests by reason.",
                               ["model_name", "finished_reason"], registry=r)
        self.ttft = h("pagedjax:time_to_first_token_seconds", "Time to first token.",
                      _LATENCY_BUCKETS)
        self.tpot = h("pagedjax:time_per_output_token_seconds",
                      "Mean time per output token after the first, per request.", _TPOT_BUCKETS)
        self.e2e = h("pagedjax:e2e_request_latency_seconds", "Arrival to finish.",
                     _LATENCY_BUCKETS)
        self.queue_time = h("pagedjax:request_queue_time_seconds",
                            "Arrival to first scheduled.", _LATENCY_BUCKETS)
        # Speculative decoding (vLLM's names; exposed with the _total suffix).
        self.spec = {key: c(f"vllm:spec_decode_{key}", doc) for key, doc in (
            ("num_drafts", "Verified rows that had proposed tokens."),
            ("num_draft_tokens", "Proposed (draft) tokens."),
            ("num_accepted_tokens", "Proposed tokens accepted by the target."))}
        self._last_spec = dict.fromkeys(self.spec, 0)
        self._last_prompt = 0
        self._last_gen = 0
        self._last_steps = 0

    # AsyncLLM's stat_logger interface (called from the engine thread only).
    def on_step(self, engine, num_requests: int) -> None:
        self.update_engine(engine, num_requests)

    def on_finished(self, output) -> None:
        self.observe_finished(output)

    def on_error(self) -> None:
        self.engine_errors.inc()

    def update_engine(self, engine, in_flight: int) -> None:
        sch = engine.scheduler
        st = sch.stats()
        self.running.set(sch.num_running)
        self.waiting.set(sch.num_waiting)
        self.in_flight.set(in_flight)
        self.pages_total.set(st.total)
        self.pages_held.set(st.used)
        self.pages_cached.set(st.cached)
        self.kv_usage.set(st.usage)
        self.compilations.set(engine.num_compilations_since(0))
        self.prefix_queries.set(st.prefix_queries)
        self.prefix_hits.set(st.prefix_hits)
        self.prefix_hit_rate.set(st.prefix_hits / st.prefix_queries if st.prefix_queries else 0.0)
        if engine.num_steps > self._last_steps:
            self.steps.inc(engine.num_steps - self._last_steps)
            self._last_steps = engine.num_steps
        p, gtok = engine.num_prompt_tokens, engine.num_generated_tokens
        if p > self._last_prompt:
            self.prompt_tokens.inc(p - self._last_prompt)
        if gtok > self._last_gen:
            self.generation_tokens.inc(gtok - self._last_gen)
        self._last_prompt, self._last_gen = p, gtok
        for key, value in (engine.spec_decode_stats() or {}).items():
            if value > self._last_spec[key]:
                self.spec[key].inc(value - self._last_spec[key])
                self._last_spec[key] = value

    def observe_finished(self, output) -> None:
        m = output.metrics
        for o in output.outputs:
            self.success.labels(self.model_name, o.finish_reason or "unknown").inc()
        if m is None:
            return
        if m.first_token_time is not None:
            self.ttft.observe(max(0.0, m.first_token_time - m.arrival_time))
        if m.finished_time is not None:
            self.e2e.observe(max(0.0, m.finished_time - m.arrival_time))
            ntok = max((len(o.token_ids) for o in output.outputs), default=0)
            if m.first_token_time is not None and ntok > 1:
                self.tpot.observe(max(0.0, (m.finished_time - m.first_token_time) / (ntok - 1)))
        if m.time_in_queue is not None:
            self.queue_time.observe(max(0.0, m.time_in_queue))

    def render(self) -> bytes:
        return generate_latest(self.registry)
