"""Every Triton kernel compiles for the A100, L4, H100 and B200 targets without a GPU, and none of
them spills registers; the committed resource table covers every kernel, shape and target."""

import dataclasses
import json
from importlib.metadata import version

import pytest

from course_lib.kernels.resources import (MAX_REGISTERS, NORM_SUITE_SHAPE, RESULTS, SHAPES, SUITE_SHAPE, TARGETS,
                                          W4A16_SUITE_SHAPE, fp8_kernels, matmul_kernels, measure, norm_kernels,
                                          table)


TRITON = tuple(int(part) for part in version("triton").split(".")[:2])
pytestmark = pytest.mark.skipif(TRITON < (3, 9), reason=f"kernels.resources drives Triton 3.9's compiler API "
                                f"(ASTSource attributes, sm_100); this is Triton {version('triton')}")


@pytest.fixture(scope="module")
def suite_report():
    return measure((SUITE_SHAPE,))


def test_every_kernel_compiles_for_every_target_without_spilling(suite_report):
    rows = suite_report["rows"]
    kernels = {row["kernel"] for row in rows}
    assert kernels >= {"decode", "decode_split", "decode_reduce", "prefill", "cache_write"}
    assert {(row["kernel"], row["target"]) for row in rows} == {(k, t) for k in kernels for t in TARGETS}
    spilled = [f"{r['kernel']} on {r['target']}: {r['stack_bytes']} B stack, {r['local_bytes']} B local"
               for r in rows if r["spills"]]
    assert not spilled, "register spills (see python -m course_lib.kernels.resources):\n" + "\n".join(spilled)
    assert all(0 < row["registers"] <= MAX_REGISTERS for row in rows)


def test_the_prefill_kernel_runs_its_products_on_tensor_cores(suite_report):
    sass = suite_report["excerpts"]["prefill"]["sass"]
    assert any("HMMA" in line for line in sass), sass  # tl.dot at head_dim 128 and 16-token blocks
    assert any("LDG" in line for line in suite_report["excerpts"]["decode"]["sass"])


def test_the_committed_table_covers_every_kernel_shape_and_target(suite_report):
    committed = json.loads(RESULTS.read_text())
    labels = {shape.label for shape in SHAPES}
    kernels = {row["kernel"] for row in suite_report["rows"]}
    assert {(r["kernel"], r["shape"], r["target"]) for r in committed["rows"]} == {
        (k, label, t) for k in kernels for label in labels for t in TARGETS}, "rerun python -m course_lib.kernels.resources"
    assert not any(r["spills"] for r in committed["rows"])
    if committed["triton"] == suite_report["triton"]:  # another Triton may allocate registers differently
        fresh = {(r["kernel"], r["target"]): r["registers"] for r in suite_report["rows"]}
        stored = {(r["kernel"], r["target"]): r["registers"] for r in committed["rows"] if r["shape"] == SUITE_SHAPE.label}
        assert stored == fresh, "the kernels changed since the table was written: rerun python -m course_lib.kernels.resources"
    assert "decode" in table(committed["rows"]) and "sm_100" in table(committed["rows"])


def test_lesson_01s_table_of_one_shape_fits_its_output_area():
    """Lesson 01 prints the suite shape's rows under a heading that names the shape: the table then
    leaves the shape column out, and each line fits the notebook's output (well under 100 characters)."""
    committed = json.loads(RESULTS.read_text())
    lines = table([row for row in committed["rows"] if row["shape"] == SUITE_SHAPE.label]).splitlines()
    assert lines[0].split() == ["kernel", *TARGETS] and SUITE_SHAPE.label not in "\n".join(lines)
    assert max(len(line) for line in lines) < 80
    assert len({line.index("regs") for line in lines[1:]}) == 1  # figures line up under their target
    assert "shape" in table(committed["rows"]).splitlines()[0]  # several shapes: the column is back


def test_the_fused_allreduce_norm_kernel_compiles_for_every_target_without_spilling():
    """8 peers' bf16 partials of a 4096-wide row (Llama-3-8B on 8 tensor-parallel ranks)."""
    rows = measure((NORM_SUITE_SHAPE,), names=list(norm_kernels()))["rows"]
    assert {(row["kernel"], row["target"]) for row in rows} == {("allreduce_norm", t) for t in TARGETS}
    assert not any(row["spills"] for row in rows), rows
    assert all(0 < row["registers"] <= MAX_REGISTERS for row in rows)


def test_the_w4a16_kernel_compiles_for_every_target_without_spilling():
    """16 fp16 tokens through a 4096 x 4096 int4 projection, groups of 128 with zero points (a
    Llama-3-8B layer in a decode batch), and the same weight symmetric; tl.dot on tensor cores."""
    symmetric = dataclasses.replace(W4A16_SUITE_SHAPE, symmetric=True)
    report = measure((W4A16_SUITE_SHAPE, symmetric), names=list(matmul_kernels()))
    rows = report["rows"]
    assert {(row["kernel"], row["shape"], row["target"]) for row in rows} == {
        ("w4a16", shape.label, t) for shape in (W4A16_SUITE_SHAPE, symmetric) for t in TARGETS}
    assert not any(row["spills"] for row in rows), rows
    assert all(0 < row["registers"] <= MAX_REGISTERS for row in rows)
    assert any("HMMA" in line for line in report["excerpts"]["w4a16"]["sass"]), report["excerpts"]["w4a16"]


def test_the_fp8_kv_cache_kernels_compile_for_every_target_without_spilling():
    """Decode (single pass and split) and prefill reading an fp8 cache's e4m3 bytes with bf16 queries at
    Llama-3-8B's attention shape: the bytes are decoded with integer bit operations, so sm_80, which
    has no fp8 conversions, compiles too; prefill's products stay on tensor cores."""
    report = measure((SUITE_SHAPE,), names=list(fp8_kernels()))
    rows = report["rows"]
    assert {(row["kernel"], row["target"]) for row in rows} == {(k, t) for k in fp8_kernels() for t in TARGETS}
    assert not any(row["spills"] for row in rows), rows
    assert all(0 < row["registers"] <= MAX_REGISTERS for row in rows)
    assert any("HMMA" in line for line in report["excerpts"]["prefill_fp8"]["sass"])
