"""How to sample a request's output: the fields, defaults and validation messages of vLLM's
``SamplingParams`` (a subset: no structured output, no logit bias, no bad words)."""

from __future__ import annotations

import functools
import functools
import math
from dataclasses import dataclass
from numbers import Integral, Real

from course_lib.engine.vllm_arguments import check_arguments


def _check_int(name: str, value, allowed: str, *, optional: bool = False) -> None:
    """An integer field gets an integer (not a bool, not 2.5): else a ValueError naming it and its range."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer ({allowed}), got {value!r}.")


def _check_finite(name: str, value, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number ({allowed}), got {value!r}.")


@dataclass(frozen=True)
class SamplingParams:
    """``temperature=0`` means greedy. ``top_k`` 0 or -1, ``top_p=1`` and ``min_p=0`` disable those
    filters; ``min_p`` drops tokens less likely than ``min_p`` times the most likely one.
    ``n`` samples share the prompt's KV blocks. ``seed`` gives the request its own random stream
    (-1 or None: it draws from the engine's, seeded by ``LLM(seed=...)``).

    Penalties, as vLLM (OpenAI's definition), on the logits before temperature and greedy's argmax:
    ``repetition_penalty`` (> 0, 1 = off) divides the positive logits and multiplies the negative
    ones of every token seen in the prompt or the output; then ``frequency_penalty`` times a token's
    count in the output and ``presence_penalty`` (once, if it is there at all) are subtracted
    (both in [-2, 2]; positive values discourage repeats).

    Stopping, as vLLM does it: a request finishes on an end-of-sequence id of the model (unless
    ``ignore_eos``), on any of ``stop_token_ids`` (kept in the output), or once its text contains
    one of the ``stop`` strings (the text is cut just before it, or just after it with
    ``include_stop_str_in_output``, which also keeps a stop token's text; the token ids are never
    cut), and at ``max_tokens`` (None: until prompt + output reach ``max_model_len``). No stop condition fires before ``min_tokens`` tokens: the sampler gives the
    EOS ids and ``stop_token_ids`` zero probability until then. ``logprobs=k`` returns, for every
    generated token, the log-probabilities of the k most likely tokens and of the sampled one,
    from the model's raw logits (before temperature and filters, vLLM's default); -1 means the
    whole vocabulary, and the engine refuses more than its ``max_logprobs`` (20, as vLLM).
    ``skip_special_tokens`` leaves special tokens (the byte tokenizer's BOS and EOS) out of the text.

    With speculative decoding a stop lands on the exact token that completes it; vLLM checks stop
    strings once per step, so its token ids may run a few verified drafts past one."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] | str | None = None
    stop_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    seed: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # vLLM takes one string or a list of them
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop or ()))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        # Types first, so that nan, inf and 2.5 meet a clear message here rather than an error inside a step.
        _check_int("n", self.n, "at least 1")
        _check_finite("temperature", self.temperature, "0 for greedy, or more")
        _check_finite("top_p", self.top_p, "in (0, 1]")
        _check_int("top_k", self.top_k, "0 or -1 to disable, or at least 1")
        _check_finite("min_p", self.min_p, "in [0, 1]")
        _check_finite("presence_penalty", self.presence_penalty, "in [-2, 2]")
        _check_finite("frequency_penalty", self.frequency_penalty, "in [-2, 2]")
        _check_finite("repetition_penalty", self.repetition_penalty, "greater than 0")
        _check_int("max_tokens", self.max_tokens, "at least 1, or None for up to max_model_len", optional=True)
        _check_int("min_tokens", self.min_tokens, "0 or more")
        _check_int("logprobs", self.logprobs, "0 or more, or -1 for the whole vocabulary", optional=True)
        _check_int("seed", self.seed, "any integer; -1 or None for the engine's random stream", optional=True)
        if self.seed == -1:  # vLLM's spelling of "not seeded"
            object.__setattr__(self, "seed", None)
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k == -1:  # vLLM's older spelling of "off"
            object.__setattr__(self, "top_k", 0)
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}.")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens}.")
        if self.logprobs is not None and self.logprobs < -1:
            raise ValueError(f"logprobs must be non-negative or -1, got {self.logprobs}.")
        if any(not s for s in self.stop):
            raise ValueError("stop cannot contain an empty string.")
        if any(isinstance(t, bool) or not isinstance(t, Integral) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative token ids, got {list(self.stop_token_ids)}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @functools.cached_property  # asked for every request at every step
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def _refusing_other_arguments(init):
    """The dataclass's ``__init__``, after a check that refuses a keyword that is not a field by name
    (vLLM's arguments this engine lacks, or a misspelling) rather than with Python's bare TypeError.
    ``functools.wraps`` keeps the fields' signature for ``help()`` and completion."""
    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        check_arguments("SamplingParams", {k: v for k, v in kwargs.items() if k not in self.__dataclass_fields__})
        init(self, *args, **kwargs)
    return checked


SamplingParams.__init__ = _refusing_other_arguments(SamplingParams.__init__)
