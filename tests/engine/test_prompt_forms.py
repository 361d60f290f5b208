"""``LLM.generate`` takes prompts in every form vLLM's does: text, token ids, ``{"prompt": ...}``,
``{"prompt_token_ids": [...]}`` (vLLM's TokensPrompt), one or a list of them, mixed; each gives the
same greedy output as its plain form, and a dict with anything else is refused up front."""

from __future__ import annotations

import pytest

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-llama", num_gpu_blocks=64, device="cpu")


def _tokens(outputs):
    return [output.outputs[0].token_ids for output in outputs]


def test_every_prompt_form_gives_the_plain_forms_output(llm):
    text, ids = "the cat sat", [5, 17, 42, 9]
    plain = _tokens(llm.generate([text, ids], GREEDY))
    assert _tokens(llm.generate([{"prompt": text}, {"prompt_token_ids": ids}], GREEDY)) == plain
    assert _tokens(llm.generate({"prompt_token_ids": ids}, GREEDY)) == plain[1:]
    one = llm.generate({"prompt": text}, GREEDY)
    assert _tokens(one) == plain[:1] and one[0].prompt == text


def test_a_prompt_dict_with_anything_else_is_refused_before_anything_is_queued(llm):
    with pytest.raises(ValueError, match="'multi_modal_data' is not supported"):
        llm.generate({"prompt": "a", "multi_modal_data": {}}, GREEDY)
    with pytest.raises(ValueError, match="needs 'prompt'"):
        llm.generate([{"prompt": "a"}, {}], GREEDY)
    assert not llm.scheduler.has_unfinished_requests()
