"""Accepted drafts highlighted token by token, from a real speculative run of the engine."""

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.widgets.draft_tokens import ACCEPTED_STYLE, TARGET_STYLE, highlight_drafts, steps_of
from course_lib.widgets.staff_answer import StaffAnswer


def test_steps_and_highlights_match_the_engines_acceptance_counts():
    llm = LLM("tiny-llama", max_model_len=256, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    output = llm.generate("the class of the class of the class", SamplingParams(temperature=0, max_tokens=40,
                                                                                ignore_eos=True))[0]
    groups = steps_of(output)
    assert [t for g in groups for t in g] == output.outputs[0].token_ids
    stats = output.metrics[0].spec_decode_stats
    assert sum(len(g) - 1 for g in groups) == stats.num_accepted_tokens > 0
    assert max(len(g) for g in groups) <= 4 and len(groups[0]) == 1  # k + 1 at most; the prefill gives one
    page = highlight_drafts(output, llm.tokenizer.decode)
    assert page.count(ACCEPTED_STYLE) == stats.num_accepted_tokens and page.count(TARGET_STYLE) == len(groups)


def test_staff_answer_opens_only_after_the_learner_wrote_something():
    card = StaffAnswer("Why?", "Because <bandwidth>.", "did you name the resource?")
    assert card.button.disabled
    card.box.value = "   "
    assert card.button.disabled
    card.box.value = "Decode reads all weights per token."
    assert not card.button.disabled
    card.button.click()
    assert "Because &lt;bandwidth&gt;." in card.reveal.value and "did you name the resource?" in card.reveal.value
