"""The per-scheme serving benchmark: what it records, the table and JSON round trip, and the committed result."""

from course_lib.engine.quant_benchmark import REFERENCE, SchemeRow, ServingResult, load_result, measure


def test_a_small_run_records_every_row_with_its_path_bytes_and_agreement(tmp_path):
    rows = (("full precision", {}, None), ("int8", {"quantization": "int8"}, None),
            (REFERENCE, {"quantization": "int8"}, "torch"), ("fp8 KV cache", {"kv_cache_dtype": "fp8"}, None))
    lines = []
    result = measure(prompts=2, prompt_tokens=16, output_tokens=4, repeats=2, dtypes=("bfloat16",), rows=rows,
                     progress=lines.append)
    assert [r.scheme for r in result.rows] == [name for name, _, _ in rows]
    assert any(line.startswith("round 2/2") for line in lines)
    full, int8, reference, fp8 = result.rows
    assert all(len(r.decode_tok_s) == 2 and r.median_tok_s > 0 for r in result.rows)
    assert (full.matmul, int8.matmul, reference.matmul) == ("", "torch._weight_int8pack_mm", "dequantize + F.linear")
    assert int8.weight_bytes == reference.weight_bytes < full.weight_bytes == fp8.weight_bytes
    assert fp8.kv_bytes * 2 == full.kv_bytes  # one byte per element against bfloat16's two
    assert full.agreement == 1.0 and 0.0 <= int8.agreement <= 1.0 and 0.0 <= int8.prefix_agreement <= 1.0
    assert result.ratio(full) == 1.0
    table = result.table()
    assert "torch._weight_int8pack_mm is" in table and "the decode speed of dequantize + matmul" in table
    result.to_json(tmp_path / "r.json")
    again = load_result(tmp_path / "r.json")
    assert again == result


def test_a_pair_running_the_same_path_is_called_noise():
    rows = [SchemeRow("float32", "full precision", [100.0]), SchemeRow("float32", "int8", [80.0], matmul="m"),
            SchemeRow("float32", REFERENCE, [64.0], matmul="m")]
    table = ServingResult(rows, "test", 1, 1, 1, 1, 1).table()
    assert "both rows ran m, so their ratio, 1.25x, is this run's noise" in table


def test_the_committed_result_has_every_scheme_in_both_dtypes():
    result = load_result()
    assert {(r.dtype, r.scheme) for r in result.rows} >= {(d, s) for d in ("float32", "bfloat16")
                                                          for s in ("full precision", "int8", "int4", "w8a8")}
    assert result.row("bfloat16", "int8").matmul == "torch._weight_int8pack_mm"
    assert result.row("bfloat16", REFERENCE).matmul == "dequantize + F.linear"
    # the machine it was measured on (an AVX2 CPU without VNNI) emulates w8a8's integer matmul exactly
    assert result.row("float32", "w8a8").matmul == "emulated int32"
    int8, reference = result.row("bfloat16", "int8"), result.row("bfloat16", REFERENCE)
    assert int8.median_tok_s > reference.median_tok_s  # what lesson 09 and the README say of it
