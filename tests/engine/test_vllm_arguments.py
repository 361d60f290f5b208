"""vLLM's arguments at this engine's front door: every one vLLM has and this engine lacks is refused
by name with what to do instead (never a bare TypeError), an unknown name gets a suggestion, the
dtype strings and ``use_tqdm`` work as vLLM's, and the README's table is the module's table."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import torch
from tqdm import tqdm

from course_lib.engine import vllm_arguments
from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.engine.vllm_arguments import ARGUMENTS, markdown_table, rows
from course_lib.models.tokenizer import ByteTokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
README = Path(__file__).resolve().parents[2] / "README.md"
ACCEPTED = ("supported", "different", "course-only")


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(tiny_model, num_gpu_blocks=64, device="cpu")


def _unsupported(owner: str) -> list[str]:
    return [a.name for a in rows(owner, "unsupported")]


@pytest.mark.parametrize("name", _unsupported("LLM"))
def test_an_unsupported_llm_argument_is_refused_by_name(tiny_model, name):
    with pytest.raises(ValueError, match=rf"LLM\({name}=\.\.\.\): vLLM has it, this course's engine does not"):
        LLM(tiny_model, num_gpu_blocks=64, device="cpu", **{name: True})


@pytest.mark.parametrize("name", _unsupported("generate"))
def test_an_unsupported_generate_argument_is_refused_before_anything_is_queued(llm, name):
    with pytest.raises(ValueError, match=rf"generate\({name}=\.\.\.\): vLLM has it"):
        llm.generate([[2, 3]], GREEDY, **{name: object()})
    assert not llm.scheduler.has_unfinished_requests()


@pytest.mark.parametrize("name", _unsupported("chat"))
def test_an_unsupported_chat_argument_is_refused_by_name(llm, name):
    with pytest.raises(ValueError, match=rf"chat\({name}=\.\.\.\): vLLM has it"):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY, **{name: None})


@pytest.mark.parametrize("name", _unsupported("SamplingParams"))
def test_an_unsupported_sampling_parameter_is_refused_by_name(name):
    with pytest.raises(ValueError, match=rf"SamplingParams\({name}=\.\.\.\): vLLM has it"):
        SamplingParams(temperature=0, **{name: 1})


def test_sampling_params_keeps_its_fields_signature_for_help_and_completion():
    assert list(inspect.signature(SamplingParams).parameters)[:3] == ["n", "temperature", "top_p"]


def test_lora_names_what_to_do_instead(tiny_model, llm):
    with pytest.raises(ValueError, match="enable_lora.*LoRA adapters: serve the base model"):
        LLM(tiny_model, enable_lora=True)
    with pytest.raises(ValueError, match="lora_request.*merge the adapter"):
        llm.generate("a", GREEDY, lora_request=None)


def test_beam_search_is_refused_with_what_to_use_instead(llm):
    with pytest.raises(ValueError, match="beam_search: vLLM has it.*SamplingParams\\(n="):
        llm.beam_search(["a"], {"beam_width": 2, "max_tokens": 4})


def test_chat_without_a_chat_template_says_so(llm):
    with pytest.raises(ValueError, match="must provide a chat template"):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY)


class _TemplatedTokenizer(ByteTokenizer):
    """A byte tokenizer with a chat template, rendered the way transformers' apply_chat_template is called."""

    chat_template = "<role>: <content>\n"

    def apply_chat_template(self, messages, *, tokenize, add_generation_prompt):
        assert tokenize is False
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")


def test_chat_with_a_chat_template_generates_from_the_rendered_conversation():
    templated = LLM("tiny-llama", tokenizer=_TemplatedTokenizer(), max_model_len=64, num_gpu_blocks=8, device="cpu")
    conversation = [{"role": "user", "content": "hi"}]
    chat = templated.chat(conversation, GREEDY, use_tqdm=False)
    plain = templated.generate("user: hi\nassistant: ", GREEDY, use_tqdm=False)
    assert chat[0].outputs[0].token_ids == plain[0].outputs[0].token_ids
    assert chat[0].prompt == "user: hi\nassistant: "


@pytest.mark.parametrize("scheme", ["gptq", "awq", "fp8", "bitsandbytes"])
def test_checkpoint_quantization_is_refused_naming_the_engines_schemes(tiny_model, scheme):
    with pytest.raises(ValueError, match=rf"quantization='{scheme}': vLLM has it.*'int8', 'int4' or 'w8a8'"):
        LLM(tiny_model, quantization=scheme)


def test_ignored_arguments_change_nothing(tiny_model, llm):
    quiet = LLM(tiny_model, num_gpu_blocks=64, device="cpu", enforce_eager=True, trust_remote_code=True,
                disable_log_stats=True, enable_chunked_prefill=True)
    prompts = [[2, 3, 4], [5, 6]]
    assert ([o.outputs[0].token_ids for o in quiet.generate(prompts, GREEDY)]
            == [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)])
    with pytest.raises(ValueError, match="enable_chunked_prefill=True"):
        LLM(tiny_model, enable_chunked_prefill=False)


@pytest.mark.parametrize("make, suggestion", [
    (lambda m, llm: SamplingParams(temprature=0), "Did you mean temperature"),
    (lambda m, llm: LLM(m, max_num_seq=4), "Did you mean max_num_seqs"),
    (lambda m, llm: llm.generate("a", sampling_param=GREEDY), "Did you mean sampling_params"),
    (lambda m, llm: LLM(m, temperature=0), "temperature is an argument of SamplingParams, not of LLM"),
    (lambda m, llm: SamplingParams(xyzzy=1), "SamplingParams has no argument 'xyzzy'"),
])
def test_a_name_nobody_has_gets_a_suggestion(tiny_model, llm, make, suggestion):
    with pytest.raises(ValueError, match=suggestion):
        make(tiny_model, llm)


@pytest.mark.parametrize("dtype, expected", [
    ("auto", torch.float32), ("float32", torch.float32), ("float", torch.float32), ("bfloat16", torch.bfloat16),
    ("float16", torch.float16), ("half", torch.float16), (torch.bfloat16, torch.bfloat16),
])
def test_dtype_takes_vllms_strings(dtype, expected):
    engine = LLM("tiny-llama", dtype=dtype, device="cpu", max_model_len=64, num_gpu_blocks=8)
    assert next(engine.model.parameters()).dtype == expected
    out = engine.generate("The", SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


@pytest.mark.parametrize("dtype, reason", [("fp32", "must be one of"), ("int8", "must be one of"),
                                           (torch.int8, "is not a floating-point dtype")])
def test_a_bad_dtype_names_the_allowed_values(dtype, reason):
    with pytest.raises(ValueError, match=rf"dtype.*{reason}.*'auto', 'float32', 'float', 'bfloat16', 'float16', 'half'"):
        LLM("tiny-llama", dtype=dtype, device="cpu")


def test_use_tqdm_shows_vllms_progress_bar_and_false_shows_none(llm, capsys):
    llm.generate([[2, 3], [4, 5], [6]], GREEDY)
    bar = capsys.readouterr().err
    assert "Processed prompts" in bar and "3/3" in bar and "est. speed input" in bar
    llm.generate([[2, 3], [4, 5], [6]], GREEDY, use_tqdm=False)
    assert capsys.readouterr().err == ""


def test_use_tqdm_takes_a_callable_in_tqdms_place(llm, capsys):
    made = []

    def bar(**kwargs):
        made.append(tqdm(**{**kwargs, "desc": "mine"}))
        return made[-1]

    llm.generate([[2, 3]], SamplingParams(temperature=0, max_tokens=2, n=2), use_tqdm=bar)
    assert "mine" in capsys.readouterr().err and made[0].n == 2  # one tick per finished sample, as vLLM


def _accepted_names(owner: str) -> set[str]:
    if owner == "SamplingParams":
        return {f.name for f in dataclasses.fields(SamplingParams)}
    function = {"LLM": LLM.__init__, "generate": LLM.generate, "chat": LLM.chat}[owner]
    return {name for name, p in inspect.signature(function).parameters.items()
            if name != "self" and p.kind is not p.VAR_KEYWORD}


@pytest.mark.parametrize("owner", vllm_arguments.OWNERS)
def test_the_table_lists_exactly_what_each_front_door_takes_by_name(owner):
    assert {a.name for a in rows(owner, *ACCEPTED)} == _accepted_names(owner)


def test_the_table_has_one_row_per_name_and_known_statuses():
    keys = [(a.owner, a.name) for a in ARGUMENTS]
    assert len(keys) == len(set(keys))
    assert {a.status for a in ARGUMENTS} <= set(vllm_arguments.STATUSES)
    assert {a.owner for a in ARGUMENTS} == set(vllm_arguments.OWNERS)


def test_the_readme_table_is_the_modules_table():
    assert markdown_table() in README.read_text()
