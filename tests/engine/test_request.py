"""The engine's per-choice request state."""

from amity.engine.request import Request
from amity.engine.sampling_params import SamplingParams


def make(prompt, forced=()) -> Request:
    return Request(request_id="r", group_id="r", choice_index=0, prompt_token_ids=list(prompt),
                   params=SamplingParams(temperature=0.0), seed=0, eos_token_ids=frozenset(),
                   max_output_tokens=8, min_output_tokens=0, forced_token_ids=list(forced))


def test_all_token_ids_is_one_list_that_grows():
    """Issue 13 (defect 15): prompt + output was rebuilt on every access (about 8
    times per request per step); it is now one list, appended to, read in O(1)."""
    r = make([5, 6, 7])
    tokens = r.all_token_ids
    for t in [8, 9]:
        r.append_output(t)
    assert r.all_token_ids is tokens and tokens == [5, 6, 7, 8, 9]
    assert (r.num_prompt_tokens, r.num_output_tokens, r.num_tokens) == (3, 2, 5)
    assert r.output_token_ids == [8, 9] and r.prompt_token_ids == [5, 6, 7]


def test_forced_output_counts_scored_tokens_over_a_fixed_pass():
    r = make([5, 6], forced=[1, 2, 3])
    tokens = r.all_token_ids
    assert tokens == [5, 6, 1, 2]  # the last forced token predicts nothing
    r.append_output(1)
    assert r.all_token_ids is tokens and tokens == [5, 6, 1, 2]
    assert r.output_token_ids == [1] and r.num_output_tokens == 1
