import pytest

from pagedjax.outputs import (CompletionOutput, Logprob, RequestOutput, get_beam_search_score,
                              make_logprobs_dict)
from pagedjax.sampling_params import (MAX_LOGIT_BIAS, MAX_LOGPROBS, BeamSearchParams,
                                      SamplingParams, SamplingType)


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.best_of, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.max_tokens == 16 and p.min_tokens == 0 and p.seed is None
    assert p.stop == [] and p.stop_token_ids == [] and p.bad_words == []
    assert p.logprobs is None and p.prompt_logprobs is None
    assert p.detokenize and p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.ignore_eos and not p.include_stop_str_in_output
    assert p.sampling_type == SamplingType.RANDOM


def test_normalisation():
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(logit_bias={"5": 1}).logit_bias == {5: 1.0}
    g = SamplingParams(temperature=0, top_k=5, top_p=0.5, min_p=0.1)
    assert g.sampling_type == SamplingType.GREEDY
    assert (g.top_k, g.top_p, g.min_p) == (0, 1.0, 0.0)
    assert SamplingParams(seed=3).sampling_type == SamplingType.RANDOM_SEED


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-1), "temperature must be >= 0"),
    (dict(top_p=0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k must be >= 0"),
    (dict(min_p=2), "min_p"),
    (dict(n=0), "n must be >= 1"),
    (dict(n=3, best_of=2), "best_of must be >= n"),
    (dict(presence_penalty=3), "presence_penalty must be in"),
    (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty must be > 0"),
    (dict(max_tokens=0), "max_tokens must be >= 1"),
    (dict(min_tokens=5, max_tokens=3), "min_tokens must be <= max_tokens"),
    (dict(logprobs=MAX_LOGPROBS + 1), "MAX_LOGPROBS"),
    (dict(prompt_logprobs=-1), "prompt_logprobs must be >= 0"),
    (dict(stop=["a", ""]), "empty string"),
    (dict(stop="a", detokenize=False), "detokenize"),
    (dict(logit_bias={1: 200.0}), "logit_bias values"),
    (dict(logit_bias={i: 1.0 for i in range(MAX_LOGIT_BIAS + 1)}), "MAX_LOGIT_BIAS"),
    (dict(allowed_token_ids=[]), "allowed_token_ids must not be empty"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"),
    (dict(temperature="hot"), "temperature must be a finite number"),
    (dict(seed=1.5), "seed must be an integer"),
])
def test_validation_messages(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_vocab_check_stop_ids_and_clone():
    p = SamplingParams(stop_token_ids=[7], allowed_token_ids=[1, 2], stop=["\n\n", "END"])
    p.update_from_generation_config({"eos_token_id": [2, 3]}, model_eos_token_id=2)
    assert p.all_stop_token_ids == {2, 3, 7}
    assert SamplingParams(ignore_eos=True).all_stop_token_ids == set()
    assert p.output_text_buffer_length == 2
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        SamplingParams(logit_bias={100: 1.0}).verify_vocab(50)
    q = p.clone()
    q.stop.append("zzz")
    assert p.stop == ["\n\n", "END"] and q.all_stop_token_ids == {2, 3, 7}


def test_beam_search_params():
    b = BeamSearchParams(beam_width=4, max_tokens=8)
    assert (b.ignore_eos, b.temperature, b.length_penalty) == (False, 0.0, 1.0)
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=8)


def test_outputs():
    d = make_logprobs_dict(5, -2.0, 3, [1, 2, 5], [-0.5, -1.0, -2.0], decode=str)
    assert list(d) == [5, 1, 2]
    assert d[5] == Logprob(-2.0, 3, "5") and d[1].rank == 1 and d[2].rank == 2
    c = CompletionOutput(0, "a", [1], None, None)
    assert not c.finished()
    r = RequestOutput("r", "p", [1], None, [c], False)
    r.add(RequestOutput("r", "p", [1], None,
                        [CompletionOutput(0, "b", [2], None, None, "stop", "b")], True))
    assert r.finished and r.outputs[0].text == "ab" and r.outputs[0].token_ids == [1, 2]
    assert r.outputs[0].finished()
    assert get_beam_search_score([1, 2, 9], -4.0, eos_token_id=9) == -2.0
