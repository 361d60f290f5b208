"""The 0%-hit cost of prefix caching (module 03): interleaved on/off pairs that never hit, timed in
one thread's CPU seconds, with the hashing timed alone."""

import pytest
import torch

from course_lib.engine import prefix_cache_cost
from course_lib.engine.prefix_cache_cost import CacheCost, measure_cache_cost, unique_prompts


def test_pairs_alternate_never_hit_and_restore_the_thread_count(monkeypatch):
    served = []
    generate = prefix_cache_cost.LLM.generate

    def recording(engine, prompts, params, **options):
        served.append(engine.kv_cache_manager.enable_caching)
        return generate(engine, prompts, params, **options)

    monkeypatch.setattr(prefix_cache_cost.LLM, "generate", recording)
    threads = torch.get_num_threads()
    prompts = unique_prompts(count=3, length=48)
    runs = []
    cost = measure_cache_cost(prompts, pairs=3, max_tokens=2, on_run=runs.append)
    assert served == [True, False] + [True, False, False, True, True, False]  # warm-ups, then on-off, off-on, ...
    assert runs == list(range(6))
    assert cost.hit_tokens == 0 and cost.queried_tokens == 3 * 3 * 48  # every run looked up every prompt token
    assert len(cost.on_s) == len(cost.off_s) == 3 and min(cost.on_s + cost.off_s) > 0 and cost.hashing_s > 0
    assert torch.get_num_threads() == threads


def test_unique_prompts_share_no_first_block():
    prompts = unique_prompts(count=12, length=192)
    assert len({tuple(p[:16]) for p in prompts}) == 12 and all(len(p) == 192 for p in prompts)


def test_the_ratio_its_spread_and_the_hashing_share():
    cost = CacheCost(on_s=[1.0, 1.1, 0.9, 1.3], off_s=[1.0, 1.0, 1.0, 1.0], queried_tokens=10, hit_tokens=0,
                     hashing_s=0.01)
    assert cost.ratios == pytest.approx([1.0, 1.1, 0.9, 1.3])
    assert cost.median_ratio == pytest.approx(1.05)
    low, high = cost.quartiles
    assert low < cost.median_ratio < high and low >= 0.9 and high <= 1.3
    assert cost.hashing_share == pytest.approx(0.01)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        measure_cache_cost(unique_prompts(2, 32), pairs=1)
