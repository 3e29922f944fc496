"""SamplingParams refuses contradictory or out-of-range controls, naming the field."""

import pytest

from amity.engine.errors import RequestError
from amity.engine.sampling_params import MAX_CHOICES_PER_REQUEST, SamplingParams
from amity.engine.structured_output import StructuredOutputSpec


@pytest.mark.parametrize("kwargs, field", [
    (dict(n=0), "n"),
    (dict(n=MAX_CHOICES_PER_REQUEST + 1), "n"),
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(min_p=1.5), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(frequency_penalty=2.5), "frequency_penalty"),
    (dict(max_tokens=4, max_total_tokens=40), "max_tokens"),
    (dict(min_tokens=2, min_total_tokens=10), "min_tokens"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens"),
    (dict(n=2, seed=[1, 2, 3]), "seed"),
    (dict(logprobs=21), "logprobs"),
    (dict(bad_word_tokens=[[]]), "bad_word_tokens"),
    (dict(stop_tokens=[[]]), "stop_tokens"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(min_p=float("nan")), "min_p"),
    (dict(encoder_repetition_penalty=float("nan")), "encoder_repetition_penalty"),
    (dict(logit_bias={3: float("-inf")}), "logit_bias"),
    (dict(logit_bias={3: float("nan")}), "logit_bias"),
])
def test_bad_values_are_refused_with_their_field(kwargs, field):
    with pytest.raises(RequestError) as error:
        SamplingParams(**kwargs)
    assert error.value.field == field


def test_seeds_per_choice():
    assert [SamplingParams(n=3, seed=10).seed_for_choice(i) for i in range(3)] == [10, 11, 12]
    assert SamplingParams(n=2, seed=[5, 9]).seed_for_choice(1) == 9
    assert SamplingParams().seed_for_choice(0) is None
    assert SamplingParams(n=MAX_CHOICES_PER_REQUEST).n == MAX_CHOICES_PER_REQUEST


@pytest.mark.parametrize("kwargs, field", [
    (dict(stop=["}"]), "stop"),
    (dict(stop_tokens=[[7]]), "stop_tokens"),
    (dict(forced_output_tokens=[7]), "forced_output_tokens"),
])
def test_a_grammar_refuses_what_would_end_or_bypass_it(kwargs, field):
    with pytest.raises(RequestError) as error:
        SamplingParams(structured_output=StructuredOutputSpec("json_object"), **kwargs)
    assert error.value.field == field
    SamplingParams(structured_output=StructuredOutputSpec("text"), **kwargs)  # text constrains nothing
