"""``LLM.generate``'s progress bar, as vLLM's: "Processed prompts", one tick per finished sample, with
the input and output tokens per second so far in its postfix."""

from __future__ import annotations

from typing import Callable

from tqdm.auto import tqdm

from course_lib.engine.request import Request


class ProgressBar:
    """``use_tqdm`` is True (tqdm's bar), False (nothing is drawn, nothing is counted) or a callable
    that takes tqdm's keyword arguments and returns a bar, used in tqdm's place (vLLM's
    ``Callable[..., tqdm]``). ``total`` counts every sample in flight when the bar starts."""

    def __init__(self, use_tqdm: bool | Callable[..., tqdm], total: int) -> None:
        if not (isinstance(use_tqdm, bool) or callable(use_tqdm)):
            raise ValueError(f"use_tqdm must be True, False or a callable returning a tqdm bar, got {use_tqdm!r}.")
        make = use_tqdm if callable(use_tqdm) else tqdm
        self.bar = make(total=total, desc="Processed prompts", dynamic_ncols=True,
                        postfix=self._speeds(0.0, 0.0)) if use_tqdm else None
        self.input_tokens = self.output_tokens = 0

    @staticmethod
    def _speeds(input_speed: float, output_speed: float) -> str:
        return f"est. speed input: {input_speed:.2f} toks/s, output: {output_speed:.2f} toks/s"

    def update(self, finished: list[Request]) -> None:
        if self.bar is None or not finished:
            return
        self.input_tokens += sum(len(r.prompt_token_ids) for r in finished)
        self.output_tokens += sum(len(r.output_token_ids) for r in finished)
        elapsed = max(self.bar.format_dict["elapsed"], 1e-9)
        self.bar.postfix = self._speeds(self.input_tokens / elapsed, self.output_tokens / elapsed)
        self.bar.update(len(finished))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
