"""The bandwidth benchmark's bookkeeping: the roofline prediction beside each measured time, and the targets."""

import json

import pytest

from course_lib.kernels import benchmark
from course_lib.perf.attention_roofline import BATCHES, CONTEXTS, SHAPE, decode_attention_bytes
from course_lib.perf.hardware import get_gpu

H200 = get_gpu("H200-141GB")


def fake_point(batch: int, context: int, share: float = 0.8, peak: float = H200.hbm_bandwidth) -> dict:
    """What ``measure`` returns for a kernel that draws ``share`` of ``peak`` (SDPA at half that)."""
    moved = decode_attention_bytes(batch, context, SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"], 2)
    paged_ms = moved / (share * peak) * 1e3
    return {"batch": batch, "context": context, "bytes_read": moved, "paged_ms": paged_ms, "sdpa_ms": 2 * paged_ms,
            "paged_gb_per_s": moved / paged_ms / 1e6, "sdpa_gb_per_s": moved / paged_ms / 2e6}


def test_the_prediction_is_the_bytes_over_the_peak_and_the_share_its_ratio_to_the_measured_time():
    row = benchmark.add_roofline(fake_point(8, 4096, share=0.75), H200.hbm_bandwidth)
    # batch 8, context 4096, 8 KV heads, dim 128, bf16: K and V are 2 * 8 * 4096 * 8 * 128 * 2 bytes
    assert row["bytes_read"] == 2 * 8 * 4096 * 8 * 128 * 2 + 2 * 8 * 32 * 128 * 2
    assert row["predicted_ms"] == pytest.approx(row["bytes_read"] / 4.8e12 * 1e3)
    assert row["paged_share_of_peak"] == pytest.approx(row["predicted_ms"] / row["paged_ms"]) == pytest.approx(0.75)
    assert row["paged_share_of_peak"] == pytest.approx(row["paged_gb_per_s"] * 1e9 / H200.hbm_bandwidth)
    assert row["target_share_of_peak"] == 0.70 and row["meets_target"] is True


@pytest.mark.parametrize("batch, context, share, target, meets", [
    (8, 4096, 0.69, 0.70, False),  # just under the big-batch target
    (128, 16384, 0.70, 0.70, True),  # exactly on it
    (4, 16384, 0.99, None, None),  # batch 2-7: no target
    (32, 1024, 0.10, None, None),  # short contexts: no target
    (1, 16384, 0.50, 0.50, True),  # split-KV's target at batch 1
    (1, 16384, 0.49, 0.50, False),
    (1, 4096, 0.10, None, None),
])
def test_each_point_is_judged_against_its_own_target(batch, context, share, target, meets):
    row = benchmark.add_roofline(fake_point(batch, context, share), H200.hbm_bandwidth)
    assert row["target_share_of_peak"] == target and row["meets_target"] is meets


def test_without_a_preset_the_prediction_is_unknown_not_invented():
    row = benchmark.add_roofline(fake_point(8, 4096), None)
    assert row["predicted_ms"] is None and row["paged_share_of_peak"] is None and row["meets_target"] is None
    assert row["target_share_of_peak"] == 0.70  # the goal exists; there is just nothing to judge it by
    assert "peak unknown" in benchmark.describe(row)


def test_the_sweep_keeps_every_measured_field_and_the_document_sums_up_the_targets():
    lines = []
    # the big-batch points reach 80% except one at 60%; batch 1 at 16k reaches 55%
    shares = {(1, 16384): 0.55, (64, 4096): 0.60}
    rows = benchmark.sweep(H200.hbm_bandwidth, lambda b, c: fake_point(b, c, shares.get((b, c), 0.8)), lines.append)
    assert [(r["batch"], r["context"]) for r in rows] == [(b, c) for b in BATCHES for c in CONTEXTS]
    measured = {"batch", "context", "bytes_read", "paged_ms", "sdpa_ms", "paged_gb_per_s", "sdpa_gb_per_s"}
    added = {"predicted_ms", "paged_share_of_peak", "target_share_of_peak", "meets_target"}
    assert all(set(r) == measured | added for r in rows)
    assert len(lines) == len(rows) and "60% of peak, target 70% missed" in lines[BATCHES.index(64) * len(CONTEXTS) + 2]
    doc = json.loads(json.dumps(benchmark.document("NVIDIA H200", H200.hbm_bandwidth, rows)))  # JSON-safe
    assert doc["device"] == "NVIDIA H200" and doc["peak_hbm_bytes_per_s"] == 4.8e12 and doc["head_dim"] == 128
    big, single = doc["targets"]
    assert big["points"] == 8 and big["worst_share_of_peak"] == pytest.approx(0.60) and big["met"] is False
    assert single["points"] == 1 and single["worst_share_of_peak"] == pytest.approx(0.55) and single["met"] is True


def test_a_document_without_a_peak_judges_no_target():
    rows = [benchmark.add_roofline(fake_point(b, c), None) for b in BATCHES for c in CONTEXTS]
    targets = benchmark.document("GPU X", None, rows)["targets"]
    assert all(t["met"] is None and t["worst_share_of_peak"] is None for t in targets)


def test_result_files_are_named_after_the_matched_preset():
    assert benchmark.device_label("NVIDIA H200") == "H200-141GB"
    assert benchmark.device_label("NVIDIA RTX 6000 Ada") == "NVIDIA_RTX_6000_Ada"
