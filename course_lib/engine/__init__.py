"""A mini vLLM V1: block pool with prefix caching, KV cache manager, token-budget scheduler,
model runner over a paged KV cache, and the ``LLM`` front door. Names follow vLLM's."""
