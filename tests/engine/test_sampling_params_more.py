"""The rest of vLLM's ``SamplingParams``: validation of the new fields, ``seed=-1`` and
``LLM(seed=...)``, ``max_tokens=None``, ``include_stop_str_in_output``, ``skip_special_tokens``
and ``RequestOutput.finished``.

Text cases run a byte-vocabulary model whose logits are fixed (``fixed_logits_model``): with a
presence penalty of 2 its greedy output is worked out by hand below, step by step.
"""

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.models.tokenizer import ByteTokenizer
from tests.engine.test_sampling_penalties import fixed_logits_model

H, I, BANG, BOS, EOS = ord("h"), ord("i"), ord("!"), 256, 257


@pytest.mark.parametrize("field, value, allowed", [
    ("presence_penalty", float("nan"), "[-2, 2]"), ("presence_penalty", float("inf"), "[-2, 2]"),
    ("presence_penalty", 2.5, "[-2, 2]"), ("frequency_penalty", -3.0, "[-2, 2]"),
    ("frequency_penalty", float("-inf"), "[-2, 2]"),
    ("repetition_penalty", 0.0, "greater than zero"), ("repetition_penalty", -1.0, "greater than zero"),
    ("repetition_penalty", float("nan"), "greater than 0"), ("repetition_penalty", float("inf"), "greater than 0"),
    ("min_p", -0.1, "[0, 1]"), ("min_p", 1.5, "[0, 1]"), ("min_p", float("nan"), "[0, 1]"),
    ("max_tokens", 0, "at least 1"), ("seed", 2.5, "integer"),
])
def test_bad_values_name_the_field_and_its_range(field, value, allowed):
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    assert field in str(error.value) and allowed in str(error.value)


def test_the_range_ends_are_allowed():
    SamplingParams(presence_penalty=-2, frequency_penalty=2, repetition_penalty=1e-3, min_p=1.0)
    SamplingParams(presence_penalty=2, frequency_penalty=-2, min_p=0.0, max_tokens=None)


def test_llm_seed_must_be_an_integer(tiny_model):
    with pytest.raises(ValueError, match="seed must be an integer"):
        LLM(tiny_model, max_model_len=32, seed=1.5)


SAMPLED = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


def sample(model, params=SAMPLED, **llm_settings) -> list[list[int]]:
    llm = LLM(model, max_model_len=32, **llm_settings)
    return [c.token_ids for o in llm.generate(PROMPTS, params) for c in o.outputs]


def test_unseeded_requests_sample_alike_on_two_llms_built_with_the_same_seed(tiny_model):
    first = sample(tiny_model, seed=7)
    torch.manual_seed(123)  # the caller's global random state plays no part
    assert sample(tiny_model, seed=7) == first
    assert sample(tiny_model, seed=8) != first
    assert sample(tiny_model) == sample(tiny_model, seed=0)  # vLLM V1's default engine seed


def test_seed_minus_one_means_not_seeded(tiny_model):
    assert SamplingParams(seed=-1).seed is None
    unseeded = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=-1)
    assert sample(tiny_model, unseeded, seed=3) == sample(tiny_model, SAMPLED, seed=3)
    assert sample(tiny_model, unseeded, seed=3) != sample(tiny_model, unseeded, seed=4)


def test_max_tokens_none_runs_to_max_model_len(tiny_model):
    llm = LLM(tiny_model, max_model_len=40)
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    short, full = llm.generate([[5] * 10, [6] * 39], params)
    assert len(short.outputs[0].token_ids) == 30 and short.outputs[0].finish_reason == "length"
    assert len(full.outputs[0].token_ids) == 1


def hi_bang_llm() -> LLM:
    """Greedy with presence_penalty=2 (``HI_BANG``) writes "hi!" then EOS: the logits are h 5, i 4.5,
    ! 4.2, EOS 4, so step 1 takes h; step 2 sees h at 3 and takes i (4.5); step 3 sees i at 2.5
    and takes ! (4.2); step 4 sees ! at 2.2 and takes EOS (4, above h's 3)."""
    return LLM(fixed_logits_model({H: 5.0, I: 4.5, BANG: 4.2, EOS: 4.0}, vocab_size=258),
               tokenizer=ByteTokenizer(), dtype=torch.float64, max_model_len=32)


HI_BANG = dict(temperature=0, max_tokens=10, presence_penalty=2.0)


@pytest.mark.parametrize("settings, text, finish, stop_reason", [
    ({}, "hi!", "stop", None),  # EOS is never text
    ({"include_stop_str_in_output": True}, "hi!", "stop", None),  # ... skipped as a special token
    ({"include_stop_str_in_output": True, "skip_special_tokens": False}, "hi!</s>", "stop", None),
    ({"skip_special_tokens": False}, "hi!", "stop", None),  # a stop token's text is left out
    ({"stop": ["i"]}, "h", "stop", "i"),
    ({"stop": ["i"], "include_stop_str_in_output": True}, "hi", "stop", "i"),
    ({"stop_token_ids": [BANG]}, "hi", "stop", BANG),
    ({"stop_token_ids": [BANG], "include_stop_str_in_output": True}, "hi!", "stop", BANG),
])
def test_stop_text_with_and_without_the_stop_string(settings, text, finish, stop_reason):
    output = hi_bang_llm().generate([[BOS, H]], SamplingParams(**HI_BANG, **settings))[0]
    completion = output.outputs[0]
    assert (completion.text, completion.finish_reason, completion.stop_reason) == (text, finish, stop_reason)
    assert completion.token_ids == [H, I, BANG, EOS][:len(completion.token_ids)]  # ids are never cut
    assert output.finished is True


def test_skip_special_tokens_false_keeps_special_tokens_in_the_text():
    """Logits BOS 6, h 5, i 4.5 with presence_penalty=2: BOS, then h (5 over BOS's 4), then i (4.5)."""
    llm = LLM(fixed_logits_model({BOS: 6.0, H: 5.0, I: 4.5}, vocab_size=258), tokenizer=ByteTokenizer(),
              dtype=torch.float64, max_model_len=32)
    params = dict(temperature=0, max_tokens=3, presence_penalty=2.0)
    kept, skipped = (llm.generate([[BOS, H]], SamplingParams(**params, skip_special_tokens=skip))[0].outputs[0]
                     for skip in (False, True))
    assert kept.token_ids == skipped.token_ids == [BOS, H, I]
    assert (kept.text, skipped.text) == ("<s>hi", "hi")


def test_stop_strings_are_searched_in_the_text_skip_special_tokens_gives():
    """"<s>h" is in the text only when special tokens are kept (output BOS, h, i as above)."""
    llm = LLM(fixed_logits_model({BOS: 6.0, H: 5.0, I: 4.5}, vocab_size=258), tokenizer=ByteTokenizer(),
              dtype=torch.float64, max_model_len=32)
    params = dict(temperature=0, max_tokens=3, presence_penalty=2.0, stop=["<s>h"])
    kept = llm.generate([[H]], SamplingParams(**params, skip_special_tokens=False))[0].outputs[0]
    skipped = llm.generate([[H]], SamplingParams(**params))[0].outputs[0]
    assert (kept.text, kept.stop_reason, kept.token_ids) == ("", "<s>h", [BOS, H])
    assert (skipped.text, skipped.finish_reason) == ("hi", "length")


def test_byte_tokenizer_decodes_special_tokens_only_when_asked():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("né") + [EOS]  # BOS, n, two bytes of é, EOS
    assert tokenizer.decode(ids) == "né"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<s>né</s>"
