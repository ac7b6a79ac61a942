"""Prometheus metrics of a running engine (served at ``/metrics``), with vLLM's names.

vLLM's (V1) names and meanings, labelled ``model_name``; counters get
prometheus' ``_total`` suffix in the exposition (``vllm:prompt_tokens_total``):

* gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (0-1);
* counters ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (prompt
  tokens looked up / found), ``vllm:num_preemptions``, ``vllm:prompt_tokens``,
  ``vllm:generation_tokens``, ``vllm:request_success`` (by ``finished_reason``),
  ``vllm:spec_decode_*``;
* histograms ``vllm:time_to_first_token_seconds`` (arrival to first token),
  ``vllm:inter_token_latency_seconds``, ``vllm:request_time_per_output_token_seconds``
  (a request's mean gap after its first token), ``vllm:e2e_request_latency_seconds``,
  ``vllm:request_queue_time_seconds``, ``vllm:request_prompt_tokens``,
  ``vllm:request_generation_tokens``.

Engine timestamps come per request (first token, finish), not per token, so
``inter_token_latency_seconds`` records each of a request's gaps as its mean
gap: its count and sum are exact, its buckets assume even gaps.

``pagedjax:`` names: the ones vLLM has no name for (pages held / cached,
requests in flight, steps, XLA compilations, engine errors, the prefix hit
rate), and, deprecated, the earlier ``pagedjax:`` spellings of the vLLM metrics
above (same values) for dashboards that read them.

Gauges are refreshed by the engine thread after every step, add and abort (it
alone touches the engine), so scraping never reads scheduler state from
another thread. Each server gets its own registry, so several engines can live
in one process (tests).
"""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401 - re-exported

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0, 160.0)
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                 2.5, 5.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


class _Both:
    """A metric kept under its vLLM name and a deprecated pagedjax: alias."""

    def __init__(self, *children):
        self.children = children

    def set(self, v) -> None:
        for c in self.children:
            c.set(v)

    def inc(self, v=1) -> None:
        for c in self.children:
            c.inc(v)

    def observe(self, v) -> None:
        for c in self.children:
            c.observe(v)


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

        def both(kind, vllm_name, old_name, doc, *args):
            return _Both(kind(vllm_name, doc, *args),
                         kind(old_name, doc + " (deprecated: use " + vllm_name + ")", *args))

        self.running = both(g, "vllm:num_requests_running", "pagedjax:num_requests_running",
                            "Requests in the running batch.")
        self.waiting = both(g, "vllm:num_requests_waiting", "pagedjax:num_requests_waiting",
                            "Requests waiting to be scheduled.")
        self.kv_usage = both(g, "vllm:kv_cache_usage_perc", "pagedjax:kv_cache_usage_perc",
                             "Fraction of KV pages in use (1 = full).")
        self.prefix_queries = c("vllm:prefix_cache_queries",
                                "Prefix cache queries, in prompt tokens looked up.")
        self.prefix_hits = c("vllm:prefix_cache_hits",
                             "Prefix cache hits, in prompt tokens found.")
        self.preemptions = c("vllm:num_preemptions", "Preemptions (requests put back to wait).")
        self.prompt_tokens = both(c, "vllm:prompt_tokens", "pagedjax:prompt_tokens",
                                  "Prompt tokens processed.")
        self.generation_tokens = both(c, "vllm:generation_tokens", "pagedjax:generation_tokens",
                                      "Tokens generated.")
        self.success = {p: Counter(f"{p}:request_success", "Finished requests by reason.",
                                   ["model_name", "finished_reason"], registry=r)
                        for p in ("vllm", "pagedjax")}
        for counter in self.success.values():  # shown at 0 before the first request
            for reason in ("stop", "length", "abort", "error"):
                counter.labels(model_name, reason)
        self.ttft = both(h, "vllm:time_to_first_token_seconds",
                         "pagedjax:time_to_first_token_seconds",
                         "Time to first token (arrival to first token).", _LATENCY_BUCKETS)
        self.itl = h("vllm:inter_token_latency_seconds",
                     "Gaps between a request's tokens (each taken as the request's mean gap).",
                     _TPOT_BUCKETS)
        self.tpot = both(h, "vllm:request_time_per_output_token_seconds",
                         "pagedjax:time_per_output_token_seconds",
                         "Mean time per output token after the first, per request.",
                         _TPOT_BUCKETS)
        self.e2e = both(h, "vllm:e2e_request_latency_seconds",
                        "pagedjax:e2e_request_latency_seconds", "Arrival to finish.",
                        _LATENCY_BUCKETS)
        self.queue_time = both(h, "vllm:request_queue_time_seconds",
                               "pagedjax:request_queue_time_seconds",
                               "Arrival to first scheduled.", _LATENCY_BUCKETS)
        self.request_prompt = h("vllm:request_prompt_tokens", "Prompt tokens per request.",
                                _TOKEN_BUCKETS)
        self.request_generation = h("vllm:request_generation_tokens",
                                    "Generated tokens per request (all its sequences).",
                                    _TOKEN_BUCKETS)
        self._pagedjax_only(g, c)
        # Speculative decoding (vLLM's names; exposed with the _total suffix).
        self.spec = {key: c(f"vllm:spec_decode_{key}", doc) for key, doc in (
            ("num_drafts", "Verified rows that had proposed tokens."),
            ("num_draft_tokens", "Proposed (draft) tokens."),
            ("num_accepted_tokens", "Proposed tokens accepted by the target."))}
        self._last: dict[str, int] = {}

    def _pagedjax_only(self, g, c) -> None:
        self.in_flight = g("pagedjax:num_requests_in_flight",
                           "HTTP-submitted engine requests not yet finished or aborted.")
        self.pages_total = g("pagedjax:kv_pages_total", "Usable KV pages.")
        self.pages_held = g("pagedjax:kv_pages_held",
                            "KV pages currently held by requests (ref count >= 1).")
        self.pages_cached = g("pagedjax:kv_pages_cached",
                              "Free KV pages that still hold reusable prefix content.")
        self.prefix_hit_rate = g("pagedjax:prefix_cache_hit_rate",
                                 "Prefix-cache hit tokens / queried tokens since start.")
        self.old_prefix = {"queries": g("pagedjax:prefix_cache_queries",
                                        "Prompt tokens looked up in the prefix cache since "
                                        "start (deprecated: use vllm:prefix_cache_queries)."),
                           "hits": g("pagedjax:prefix_cache_hits",
                                     "Prompt tokens found in the prefix cache since start "
                                     "(deprecated: use vllm:prefix_cache_hits).")}
        self.steps = c("pagedjax:engine_steps", "Engine steps run.")
        self.compilations = g("pagedjax:xla_compilations",
                              "XLA compilations in this process since start (new step shapes).")
        self.engine_errors = c("pagedjax:engine_errors", "Exceptions caught in the engine thread.")

    # AsyncLLM's stat_logger interface (called from the engine thread only).
    def on_step(self, engine, num_requests: int) -> None:
        self.update_engine(engine, num_requests)

    def on_finished(self, output, seqs=None) -> None:
        self.observe_finished(output, seqs)

    def on_error(self) -> None:
        self.engine_errors.inc()

    def _advance(self, key: str, counter, total: int) -> None:
        """Move ``counter`` up to the engine's running ``total``."""
        last = self._last.get(key, 0)
        if total > last:
            counter.inc(total - last)
            self._last[key] = total

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
        self.old_prefix["queries"].set(st.prefix_queries)
        self.old_prefix["hits"].set(st.prefix_hits)
        self.prefix_hit_rate.set(st.prefix_hits / st.prefix_queries if st.prefix_queries else 0.0)
        for key, counter, total in (
                ("prefix_queries", self.prefix_queries, st.prefix_queries),
                ("prefix_hits", self.prefix_hits, st.prefix_hits),
                ("preemptions", self.preemptions, sch.num_preemptions),
                ("steps", self.steps, engine.num_steps),
                ("prompt", self.prompt_tokens, engine.num_prompt_tokens),
                ("generation", self.generation_tokens, engine.num_generated_tokens)):
            self._advance(key, counter, total)
        for key, value in (engine.spec_decode_stats() or {}).items():
            self._advance("spec_" + key, self.spec[key], value)

    def observe_finished(self, output, seqs=None) -> None:
        """A finished request's final output; ``seqs``: (finish reason, generated
        tokens) per completion when the output does not hold them all (a delta)."""
        if seqs is None:
            seqs = [(o.finish_reason, len(o.token_ids)) for o in output.outputs]
        for reason, _ in seqs:
            for counter in self.success.values():
                counter.labels(self.model_name, reason or "unknown").inc()
        self.request_prompt.observe(len(output.prompt_token_ids or ()))
        self.request_generation.observe(sum(n for _, n in seqs))
        m = output.metrics
        if m is None:
            return
        if m.first_token_time is not None:
            self.ttft.observe(max(0.0, m.first_token_time - m.arrival_time))
        if m.finished_time is not None:
            self.e2e.observe(max(0.0, m.finished_time - m.arrival_time))
            ntok = max((n for _, n in seqs), default=0)
            if m.first_token_time is not None and ntok > 1:
                self._observe_gaps(max(0.0, m.finished_time - m.first_token_time), ntok - 1)
        if m.time_in_queue is not None:
            self.queue_time.observe(max(0.0, m.time_in_queue))

    def _observe_gaps(self, decode_time: float, num_gaps: int) -> None:
        """One request's decode time over its gaps (a microsecond per gap, on the engine
        thread once per finished request: far below the detokenizer's per-token cost)."""
        mean = decode_time / num_gaps
        self.tpot.observe(mean)
        for _ in range(num_gaps):
            self.itl.observe(mean)

    def render(self) -> bytes:
        return generate_latest(self.registry)
