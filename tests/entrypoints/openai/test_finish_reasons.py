"""What a client sees of an output that failed while generating (finish_reason 'error'):
OpenAI's 'stop' plus a readable error, never the engine's own reasons."""

from __future__ import annotations

from pagedjax.entrypoints.openai import formatting as fmt
from pagedjax.outputs import CompletionOutput


def _out(reason, stop_reason=None):
    return CompletionOutput(index=0, text="a", token_ids=[1], cumulative_logprob=None,
                            logprobs=None, finish_reason=reason, stop_reason=stop_reason)


def test_error_output_maps_to_stop_and_an_error():
    failed = _out("error", "structured output failed: lexer error: too many expressions")
    assert fmt.openai_finish(failed) == ("stop", None)
    err = fmt.generation_error(failed)
    assert err.status == 500 and err.body()["error"]["code"] == "generation_failed"
    assert "lexer error" in err.body()["error"]["message"]
    for reason, stop_reason in (("stop", "\n"), ("length", None), (None, None)):
        o = _out(reason, stop_reason)
        assert fmt.openai_finish(o) == (reason, stop_reason)
        assert fmt.generation_error(o) is None


def test_conflicting_constraints_are_the_clients_error():
    """A sequence ended because allowed_token_ids and its grammar left no common token:
    a 400 naming allowed_token_ids (the request's constraints), not a 500."""
    from pagedjax.structured_output.grammar import CONFLICT

    err = fmt.generation_error(_out("error", f"{CONFLICT} after 3 output tokens: ..."))
    assert err.status == 400 and err.param == "allowed_token_ids"
    assert err.body()["error"]["code"] == "conflicting_constraints"
    assert err.body()["error"]["type"] == "invalid_request_error"
