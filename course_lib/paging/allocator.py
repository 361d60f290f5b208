"""What every KV allocator offers, and the bookkeeping they share.

An allocator holds KV slots (one slot = one token's K and V for every layer) for
requests. It never knows how long a request will finally be; only the accounting
in ``report.py`` does, because the trace tells it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from course_lib.checks import require_positive


class PoolExhausted(RuntimeError):
    """The pool has no room for this allocation right now (not a configuration error)."""


class KVAllocator(ABC):
    """Shared bookkeeping: each live request's current length, checked against ``max_model_len``.

    Invariant: for every live request, ``0 < length <= slots_held(req) <= max_model_len``
    for reserve-for-max, and ``slots_held(req) - length < block_size`` for paged.
    """

    def __init__(self, capacity_tokens: int, max_model_len: int) -> None:
        require_positive("capacity_tokens", capacity_tokens)
        require_positive("max_model_len", max_model_len)
        if capacity_tokens < max_model_len:
            raise ValueError(
                f"A pool of {capacity_tokens} tokens cannot hold one request of max_model_len="
                f"{max_model_len} tokens; give the pool more memory or lower max_model_len."
            )
        self.capacity_tokens = capacity_tokens
        self.max_model_len = max_model_len
        self.lengths: dict[str, int] = {}

    # --- the operations a server performs -------------------------------------------
    def admit(self, req_id: str, prompt_len: int, max_tokens: int | None = None) -> None:
        """Store a new request's prompt. ``max_tokens`` caps its output (default: up to max_model_len)."""
        if req_id in self.lengths:
            raise ValueError(f"Request {req_id!r} is already admitted; use a new request id.")
        require_positive("prompt_len", prompt_len)
        if prompt_len > self.max_model_len:
            raise ValueError(
                f"Request {req_id!r} has a {prompt_len}-token prompt, longer than max_model_len="
                f"{self.max_model_len}; shorten the prompt or raise max_model_len."
            )
        if not self.can_admit(prompt_len, max_tokens):
            raise PoolExhausted(f"No room for request {req_id!r} ({prompt_len} prompt tokens).")
        self._allocate(req_id, prompt_len, self._limit(prompt_len, max_tokens))
        self.lengths[req_id] = prompt_len

    def append_token(self, req_id: str) -> None:
        """Store one generated token of a live request."""
        length = self._length(req_id)
        if length >= self.max_model_len:
            raise ValueError(
                f"Request {req_id!r} already holds max_model_len={self.max_model_len} tokens; "
                f"stop generating or raise max_model_len."
            )
        self._grow(req_id, length + 1)
        self.lengths[req_id] = length + 1

    def free(self, req_id: str) -> None:
        """Release everything a request holds."""
        self._length(req_id)
        self._release(req_id)
        del self.lengths[req_id]

    def can_admit(self, prompt_len: int, max_tokens: int | None = None) -> bool:
        """Whether a request with this prompt and output cap fits in the pool right now."""
        return self._fits(prompt_len, self._limit(prompt_len, max_tokens))

    def _limit(self, prompt_len: int, max_tokens: int | None) -> int:
        """The most tokens the request may ever hold."""
        return self.max_model_len if max_tokens is None else min(self.max_model_len, prompt_len + max_tokens)

    def _length(self, req_id: str) -> int:
        try:
            return self.lengths[req_id]
        except KeyError:
            raise KeyError(f"Request {req_id!r} is not live in this allocator.") from None

    # --- what each allocator decides ------------------------------------------------
    @abstractmethod
    def _fits(self, prompt_len: int, limit: int) -> bool:
        """Whether a request with this prompt, that may grow to ``limit`` tokens, fits now."""

    @abstractmethod
    def slots_held(self, req_id: str) -> int:
        """KV slots this request holds, used or not."""

    @abstractmethod
    def stranded_slots(self) -> int:
        """Free slots outside the largest contiguous free run (external fragmentation)."""

    @abstractmethod
    def _allocate(self, req_id: str, prompt_len: int, limit: int) -> None: ...

    @abstractmethod
    def _grow(self, req_id: str, new_length: int) -> None: ...

    @abstractmethod
    def _release(self, req_id: str) -> None: ...

    @property
    def free_slots(self) -> int:
        """Slots no request holds."""
        return self.capacity_tokens - sum(self.slots_held(r) for r in self.lengths)
