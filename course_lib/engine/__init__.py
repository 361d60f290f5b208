"""A mini vLLM V1: block pool with prefix caching, KV cache manager, token-budget scheduler,
model runner over a paged KV cache, and the ``LLM`` front door. Names follow vLLM's, so
``from course_lib.engine import LLM, SamplingParams`` works as ``from vllm import ...`` does.

The two names load on first use (PEP 562): the model code imports ``engine.attention``, and an
eager import of ``engine.llm`` here would import the model code back while it is half-defined."""

_EXPORTS = {"LLM": "course_lib.engine.llm", "SamplingParams": "course_lib.engine.sampling_params"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'course_lib.engine' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
