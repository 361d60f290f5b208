"""Every Triton kernel of the course compiled for real GPU targets, on any machine, and what it uses.

    python -m course_lib.kernels.resources          # all shapes x targets -> benchmarks/results/kernel_resources.json
    python -m course_lib.kernels.resources --suite  # one Llama-like shape (what the test suite checks)

Triton compiles for a GPU it cannot see: ``triton.compile`` with a ``GPUTarget`` gives PTX and a
cubin, and ``cuobjdump -res-usage`` (shipped inside the triton wheel) reads each kernel's
registers per thread, stack and local memory. A kernel that needs more registers than a thread
may have (255) **spills** them to local memory, which lives in DRAM: its stack or local size is
then above 0, and every spilled value costs a memory round trip on every GPU. The suite fails on
any such kernel.

Kernels are compiled as the wrappers launch them (the same constexprs, from the wrappers' own
``*_constants`` functions; pointers and strides marked 16-divisible, as Triton's launcher marks
them for these shapes). Compiles run in worker processes without ``TRITON_INTERPRET``, since the
interpreter replaces kernels by Python functions that cannot be compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from importlib.metadata import version
from multiprocessing import get_context
from pathlib import Path

from course_lib.paths import RESULTS_DIR
from course_lib.perf.attention_roofline import MAX_PARTITIONS

TARGETS = {"sm_80": 80, "sm_89": 89, "sm_90": 90, "sm_100": 100}  # A100, L4/Ada, H100/H200, B200
MAX_REGISTERS = 255  # per thread; past it the compiler spills to local memory
RESULTS = RESULTS_DIR / "kernel_resources.json"


@dataclass(frozen=True)
class KernelShape:
    """The shapes a kernel is specialised for: head size, KV block size, query heads per KV head."""

    head_dim: int
    block_size: int
    group: int  # query heads sharing one KV head (1: MHA; 4: Llama-3-8B's GQA)
    dtype: str  # "bf16", "fp16" or "fp32"
    kv_heads: int = 8

    @property
    def label(self) -> str:
        return f"head_dim {self.head_dim}, block {self.block_size}, GQA {self.group}, {self.dtype}"


SUITE_SHAPE = KernelShape(128, 16, 4, "bf16")  # Llama-3-8B's attention
TINY_LLAMA_SHAPE = KernelShape(32, 16, 3, "bf16", kv_heads=2)  # the shipped model, in bf16 on a GPU
SHAPES = tuple(KernelShape(dim, 16, group, dtype) for dim in (64, 128) for group in (1, 4, 8)
               for dtype in ("fp16", "bf16")) + (TINY_LLAMA_SHAPE, KernelShape(128, 16, 4, "fp32"))


@dataclass(frozen=True)
class Resources:
    kernel: str
    target: str
    shape: str
    registers: int  # per thread
    stack_bytes: int  # per thread; above 0 means spills (or a local array)
    local_bytes: int
    shared_bytes: int  # dynamic shared memory per program, from Triton
    num_warps: int

    @property
    def spills(self) -> bool:
        return self.stack_bytes > 0 or self.local_bytes > 0


INDEX_POINTERS = {"tables_ptr": "i32", "lens_ptr": "i32", "starts_ptr": "i32", "slots_ptr": "i64"}
STATE_POINTERS = {"part_max_ptr": "fp32", "part_sum_ptr": "fp32"}  # split decode's softmax states


@dataclass(frozen=True)
class KernelSpec:
    """How a wrapper launches a kernel: its constexprs for a shape, the element type of every
    pointer that does not point at the cache's dtype, the ints that are multiples of 16 at the
    suite's shapes (Triton's launcher marks such values, and pointers, as 16-divisible) and those
    that are 1 (which the launcher compiles in as constants)."""

    fn: object
    constants: object  # KernelShape -> dict
    pointers: dict
    aligned_ints: tuple[str, ...]
    ones: tuple[str, ...] = ()


def kernels() -> dict[str, KernelSpec]:
    """The course's kernels by name, imported on first call (a worker compiles them; under the
    interpreter they are Python functions and only their names are of use)."""
    from course_lib.kernels import cache_write, paged_attention as pa

    decode_strides = ("stride_qb", "stride_qh", "stride_kb", "stride_ks", "stride_kh", "stride_tb")
    split_strides = ("stride_ob", "stride_oh", "stride_op", "partition_tokens")
    return {
        "decode": KernelSpec(pa._decode_kernel, lambda s: pa.decode_constants(s.group, s.block_size, s.head_dim),
                             INDEX_POINTERS | STATE_POINTERS, decode_strides + ("partition_tokens",)),
        "decode_split": KernelSpec(pa._decode_kernel,
                                   lambda s: pa.decode_constants(s.group, s.block_size, s.head_dim, split=True),
                                   INDEX_POINTERS | STATE_POINTERS | {"out_ptr": "fp32"},
                                   decode_strides + split_strides),
        "decode_reduce": KernelSpec(pa._reduce_partitions_kernel,
                                    lambda s: pa.reduce_constants(MAX_PARTITIONS, s.head_dim),  # its biggest tile
                                    STATE_POINTERS | {"part_out_ptr": "fp32"},
                                    ("stride_pb", "stride_ph", "stride_pp", "stride_qb", "stride_qh")),
        "prefill": KernelSpec(pa._prefill_kernel, lambda s: pa.prefill_constants(s.group, s.block_size, s.head_dim),
                              INDEX_POINTERS, ("stride_qn",) + decode_strides[1:]),
        "cache_write": KernelSpec(cache_write._write_kernel,
                                  lambda s: cache_write.write_constants(s.kv_heads, s.head_dim), INDEX_POINTERS,
                                  ("block_size", "stride_kn", "stride_kh", "stride_vn", "stride_vh", "stride_kcb",
                                   "stride_kcs", "stride_kch", "stride_vcb", "stride_vcs", "stride_vch"),
                                  ("stride_kd", "stride_vd", "stride_kcd", "stride_vcd")),
    }


@dataclass(frozen=True)
class NormShape:
    """The shapes the fused all-reduce + residual + RMSNorm kernel is specialised for."""

    peers: int  # tensor-parallel ranks whose partial outputs are summed
    hidden: int
    dtype: str

    @property
    def label(self) -> str:
        return f"{self.peers} peers, hidden {self.hidden}, {self.dtype}"


NORM_SUITE_SHAPE = NormShape(8, 4096, "bf16")  # Llama-3-8B's hidden size on 8 tensor-parallel ranks


def norm_kernels() -> dict[str, KernelSpec]:
    """The kernels specialised for a ``NormShape`` rather than a ``KernelShape`` (their own
    check in the suite; not in ``kernels()``, whose table is per attention shape)."""
    from course_lib.kernels import fused_allreduce_norm as fused

    return {"allreduce_norm": KernelSpec(fused._allreduce_norm_kernel,
                                         lambda s: fused.allreduce_norm_constants(s.peers, s.hidden), {},
                                         ("stride_pn", "stride_pt", "stride_rt", "stride_ot"))}


@dataclass(frozen=True)
class MatmulShape:
    """The shapes the W4A16 matmul (int4 weights, 16-bit activations) is specialised for."""

    m: int  # tokens in the batch
    n: int  # the layer's outputs
    k: int  # its inputs
    group_size: int  # weights per scale along K
    symmetric: bool  # u - 8, or u - a zero point per group
    dtype: str  # the activations'

    @property
    def label(self) -> str:
        zeros = "symmetric" if self.symmetric else "zero points"
        return f"M {self.m}, N {self.n}, K {self.k}, G {self.group_size}, {zeros}, {self.dtype}"


W4A16_SUITE_SHAPE = MatmulShape(16, 4096, 4096, 128, False, "fp16")  # a Llama-3-8B projection, 16 decodes


def matmul_kernels() -> dict[str, KernelSpec]:
    """The kernels specialised for a ``MatmulShape`` (their own check in the suite)."""
    from course_lib.kernels import w4a16

    return {"w4a16": KernelSpec(w4a16._w4a16_kernel,
                                lambda s: w4a16.w4a16_constants(s.m, s.group_size, s.symmetric),
                                {"packed_ptr": "u8", "scales_ptr": "fp32", "zeros_ptr": "u8"},
                                ("M", "N", "K", "stride_xm", "stride_pn", "stride_sn", "stride_zn", "stride_ym"))}


def fp8_kernels() -> dict[str, KernelSpec]:
    """The attention kernels reading an fp8 KV cache (e4m3 bytes, decoded in registers) at a
    ``KernelShape`` whose dtype is the queries'; checked in the suite, not in the committed table."""
    specs = kernels()
    fp8 = {"k_ptr": "u8", "v_ptr": "u8"}

    def variant(name: str) -> KernelSpec:
        spec = specs[name]
        return KernelSpec(spec.fn, lambda s: spec.constants(s) | {"FP8": True}, spec.pointers | fp8,
                          spec.aligned_ints, spec.ones)

    return {f"{name}_fp8": variant(name) for name in ("decode", "decode_split", "prefill")}


def signature(spec: KernelSpec, constants: dict, dtype: str) -> tuple[dict, dict]:
    """Triton's signature and attributes for a kernel: pointers (``*_ptr``) to ``dtype`` unless
    the spec says otherwise, ``scale``, ``eps`` and ``*_scale`` floats, constexprs by name, every
    other argument an int; pointers and the spec's aligned ints marked divisible by 16."""
    types, attrs = {}, {}
    for index, name in enumerate(spec.fn.arg_names):
        if name in constants:
            types[name] = "constexpr"
        elif name.endswith("_ptr"):
            types[name] = "*" + spec.pointers.get(name, dtype)
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name in ("scale", "eps") or name.endswith("_scale"):
            types[name] = "fp32"
        else:
            types[name] = "i32"
            if name in spec.aligned_ints:
                attrs[(index,)] = [["tt.divisibility", 16]]
    return types, attrs


def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def compile_kernel(name: str, shape: KernelShape, target: str) -> tuple[Resources, dict]:
    """Compile one kernel for one target; its resources and its assembly (PTX text, cubin bytes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = (kernels() | norm_kernels() | matmul_kernels() | fp8_kernels())[name]
    constants = spec.constants(shape) | dict.fromkeys(spec.ones, 1)
    options = {key: constants.pop(key) for key in ("num_warps",) if key in constants}  # launch options
    types, attrs = signature(spec, constants, shape.dtype)
    compiled = triton.compile(ASTSource(spec.fn, types, constants, attrs),
                              target=GPUTarget("cuda", TARGETS[target], 32), options=options)
    usage = _resource_usage(compiled.asm["cubin"])
    resources = Resources(name, target, shape.label, usage["REG"], usage["STACK"], usage["LOCAL"],
                          compiled.metadata.shared, compiled.metadata.num_warps)
    return resources, {"ptx": compiled.asm["ptx"], "cubin": compiled.asm["cubin"]}


def _resource_usage(cubin: bytes) -> dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run([_tool("cuobjdump"), "-res-usage", file.name], capture_output=True, text=True,
                              check=True).stdout
    found = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text))
    if set(found) != {"REG", "STACK", "LOCAL"}:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{text}")
    return {key: int(value) for key, value in found.items()}


PTX_LINES = ((r"ld\.global\.v\d", r"ld\.global"), (r"\bmma\b", r"fma\.rn\.f32"))
SASS_LINES = ((r"LDG\.E\.(128|64)", r"\bLDG"), (r"HMMA", r"FFMA"))


def excerpt(assembly: dict, ptx_lines=PTX_LINES, sass_lines=SASS_LINES, lines_each: int = 3) -> dict[str, list[str]]:
    """A few PTX and SASS lines of a compiled kernel: its first vector loads from global memory
    (plain loads where it has none) and its first tensor-core multiply-adds (``mma``/``HMMA``;
    scalar ``fma``/``FFMA`` where it has none). Each entry of ``*_lines`` is a list of patterns
    tried in order."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(assembly["cubin"])
        file.flush()
        sass = subprocess.run([_tool("cuobjdump"), "-sass", file.name], capture_output=True, text=True,
                              check=True).stdout.splitlines()

    def pick(lines, alternatives):
        chosen = []
        for patterns in alternatives:
            for pattern in patterns:
                found = [line.strip() for line in lines if re.search(pattern, line)]
                if found:
                    chosen += found[:lines_each]
                    break
        return chosen

    return {"ptx": pick(assembly["ptx"].splitlines(), ptx_lines), "sass": pick(sass, sass_lines)}


def _without_interpreter() -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated: no warning per worker


def _job(name: str, shape: KernelShape, target: str, with_excerpt: bool) -> tuple[dict, dict | None]:
    resources, assembly = compile_kernel(name, shape, target)
    return asdict(resources) | {"spills": resources.spills}, excerpt(assembly) if with_excerpt else None


def measure(shapes=(SUITE_SHAPE,), targets=tuple(TARGETS), names=None, workers: int | None = None,
            on_done=None) -> dict:
    """Resources of every kernel x shape x target, compiled in parallel worker processes, and PTX /
    SASS excerpts of each kernel at the first shape on sm_90. ``on_done(i)`` reports progress."""
    names = list(names or kernels())  # importing the kernels compiles nothing, interpreted or not
    jobs = [(name, shape, target, shape == shapes[0] and target == "sm_90")
            for shape in shapes for name in names for target in targets]
    with ProcessPoolExecutor(workers or os.cpu_count(), mp_context=get_context("spawn"),
                             initializer=_without_interpreter) as pool:
        futures = [pool.submit(_job, *job) for job in jobs]
        rows, excerpts = [], {}
        for i, (job, future) in enumerate(zip(jobs, futures)):
            row, picked = future.result()
            rows.append(row)
            if picked is not None:
                excerpts[job[0]] = {"target": job[2], "shape": job[1].label, **picked}
            if on_done is not None:
                on_done(i)
    return {"triton": version("triton"), "max_registers": MAX_REGISTERS, "rows": rows, "excerpts": excerpts}


def table(rows: list[dict]) -> str:
    """The resources as text: one line per kernel (and shape, when the rows hold more than one),
    registers (and spills) per target, each column as wide as its widest entry."""
    targets = list(dict.fromkeys(row["target"] for row in rows))
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for row in rows:
        groups.setdefault((row["kernel"], row["shape"]), {})[row["target"]] = row

    def cell(row: dict | None) -> str:
        if row is None:
            return "-"
        spill = f" +{row['stack_bytes'] + row['local_bytes']} B stack" if row["spills"] else ""
        return f"{row['registers']} regs{spill}"

    with_shape = len({shape for _, shape in groups}) > 1
    lines = [["kernel", *(["shape"] if with_shape else []), *targets]]
    lines += [[kernel, *([shape] if with_shape else []), *(cell(by_target.get(t)) for t in targets)]
              for (kernel, shape), by_target in groups.items()]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    labels = 2 if with_shape else 1  # left-aligned text columns, then right-aligned figures
    return "\n".join("  ".join(f"{text:<{width}}" if i < labels else f"{text:>{width}}"
                                for i, (text, width) in enumerate(zip(line, widths))).rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", action="store_true", help="only the Llama-3-8B-like shape the suite checks")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    shapes = (SUITE_SHAPE,) if args.suite else (SUITE_SHAPE, *[s for s in SHAPES if s != SUITE_SHAPE])
    report = measure(shapes, on_done=lambda i: print(".", end="", flush=True))
    print()
    print(table(report["rows"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print("wrote", args.out)
    spilled = [f"{r['kernel']} on {r['target']} ({r['shape']})" for r in report["rows"] if r["spills"]]
    if spilled:
        print("spills:", "; ".join(spilled))
    return 1 if spilled else 0


if __name__ == "__main__":
    raise SystemExit(main())
