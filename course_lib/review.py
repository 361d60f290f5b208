"""The course in one table: for every module, the resource that bounds you and what relieves it.

Each row names a module's lesson, the resource that limits the system it teaches (one of
``RESOURCES``), the technique that relieves it, and the figures that show the bound, computed
here from ``course_lib.perf`` and ``course_lib.paging`` with the presets the lessons use
(Llama-3.1-8B and -70B on H100s), never typed in. ``resource_map()`` builds the rows;
``as_markdown`` renders them as a table whose lesson names link to the lessons. ``STAFF_QUESTIONS``
holds the course's open questions with their staff answers, each naming the lesson that teaches it,
so that the lessons and the final review show an answer only once the learner has written theirs.

Invariant: every row's ``figures`` are exactly what the named cost model returns (the tests call
the same functions), and every sentence in ``evidence`` is formatted from those figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from course_lib import outline
from course_lib.paging.paged import PagedAllocator
from course_lib.paging.reserve_for_max import ReserveForMaxAllocator
from course_lib.paging.simulate import simulate
from course_lib.paging.trace import sample_chat_trace
from course_lib.perf import kv_tiers, quant_cost, tp_all_reduce, topology
from course_lib.perf.comm import DOUBLE_BINARY_TREE, RING, TREE_CHUNK_BYTES, crossover_bytes
from course_lib.perf.hardware import get_gpu
from course_lib.perf.interconnect import INFINIBAND_NDR, NVLINK_4, get_link
from course_lib.perf.kv import model_kv_bytes_per_token, plan_kv_cache
from course_lib.perf.models import get_model
from course_lib.perf.roofline import ridge_point, step_cost
from course_lib.perf.serving import expected_tokens_per_step, kv_transfer
from course_lib.perf.units import MiB, format_bytes, format_duration, format_number, plural

KV_MEMORY, MEMORY_BANDWIDTH, INTERCONNECT_BANDWIDTH, LATENCY = (
    "KV memory", "memory bandwidth", "interconnect bandwidth", "latency")
RESOURCES = (KV_MEMORY, MEMORY_BANDWIDTH, INTERCONNECT_BANDWIDTH, LATENCY)

SMALL_MODEL, LARGE_MODEL, GPU_NAME = "Llama-3.1-8B", "Llama-3.1-70B", "H100-80GB"
DECODE_CONTEXT = 1024  # cached tokens per decoding sequence, as in module 04's roofline table
RECOMPUTE_FLOPS = 500e12  # an achieved prefill rate on an H100, as in module 09


@dataclass(frozen=True)
class Bound:
    """One module's row: ``module`` one of the outline's (its title and lesson file come from
    ``course_lib.outline``), ``resource`` one of ``RESOURCES``, ``figures`` the computed numbers
    that ``evidence`` quotes, ``aspect`` which part of the module the row covers when it has two."""

    module: str
    resource: str
    evidence: str
    technique: str
    figures: dict[str, float] = field(default_factory=dict)
    aspect: str = ""

    def __post_init__(self) -> None:
        if self.resource not in RESOURCES:
            raise ValueError(f"{self.module}: resource must be one of {RESOURCES}, got {self.resource!r}.")
        outline.lesson(self.module)  # an unknown module raises, naming the known ones

    @property
    def title(self) -> str:
        return outline.lesson(self.module).title

    @property
    def lesson(self) -> str:
        """The lesson's file name, ``NN_name.ipynb``."""
        return outline.lesson(self.module).file


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def paging() -> Bound:
    model, gpu = get_model(SMALL_MODEL), get_gpu(GPU_NAME)
    per_token = model_kv_bytes_per_token(model, "bf16")
    plan = plan_kv_cache(model, gpu)
    trace = sample_chat_trace(1500, max_model_len=2048, seed=0)  # module 01's simulation
    reserve = simulate(ReserveForMaxAllocator(32768, 2048), trace, 400).mean_waste_fraction
    paged = simulate(PagedAllocator(2048, 16, 2048), trace, 400).mean_waste_fraction
    tokens = plan.num_blocks * plan.block_size
    return Bound(
        "01", KV_MEMORY,
        f"{model.name} keeps {format_bytes(per_token)} of KV per token; an {gpu.name} at gpu_memory_utilization "
        f"{plan.budget_bytes / plan.gpu_memory_bytes:g} holds {tokens:,} tokens of it after the weights. Reserving each request's maximum wasted {reserve:.1%} of that memory in module 01's "
        f"simulation, 16-token blocks {paged:.1%}.",
        "PagedAttention: fixed-size blocks handed out on demand through a block table; copy-on-write to share them; "
        "GQA/MQA for fewer bytes per token",
        {"kv_bytes_per_token": per_token, "kv_tokens_on_gpu": tokens, "reserve_waste": reserve, "paged_waste": paged})


def _decode(batch: int):
    return step_cost(get_model(SMALL_MODEL), get_gpu(GPU_NAME), [(DECODE_CONTEXT, 1)] * batch)


def batching() -> Bound:
    one, many = _decode(1), _decode(64)
    return Bound(
        "02", MEMORY_BANDWIDTH,
        f"A decode step at batch 1 reads {one.bytes / 1e9:.1f} GB (the weights, mostly) for "
        f"{one.flops / 1e9:.0f} GFLOPs and takes {_ms(one.time_s)}; at batch 64 it reads {many.bytes / 1e9:.1f} GB "
        f"and takes {_ms(many.time_s)}: 64 tokens for {many.time_s / one.time_s:.1f}x the time of one.",
        "continuous batching: refill a slot in the step it frees, so every weight read serves a full batch",
        {"batch1_bytes": one.bytes, "batch1_flops": one.flops, "batch1_s": one.time_s,
         "batch64_bytes": many.bytes, "batch64_s": many.time_s})


def scheduler(document: int = 16_000, decoders: int = 32, budget: int = 2048) -> Bound:
    model, gpu = get_model(SMALL_MODEL), get_gpu(GPU_NAME)
    decodes = [(DECODE_CONTEXT, 1)] * decoders
    alone = step_cost(model, gpu, decodes).time_s
    whole = step_cost(model, gpu, decodes + [(0, document)]).time_s
    chunked = step_cost(model, gpu, decodes + [(0, budget - decoders)]).time_s
    return Bound(
        "03", LATENCY,
        f"{decoders} decodes alone take {_ms(alone)} a step; with a whole {document:,}-token prompt in the same step, "
        f"{_ms(whole)}: every user's next token waits for it. Within a {budget:,}-token budget the step is "
        f"{_ms(chunked)}.",
        "the token budget (max_num_batched_tokens) with chunked prefill and a per-request cap "
        "(long_prefill_token_threshold); prefix caching so repeated prefixes are not computed again",
        {"decodes_s": alone, "whole_prefill_s": whole, "chunked_s": chunked})


def roofline() -> Bound:
    gpu = get_gpu(GPU_NAME)
    prefill = step_cost(get_model(SMALL_MODEL), gpu, [(0, 2048)])
    decode = _decode(1)
    tokens = expected_tokens_per_step(0.8, 4)
    transfer = kv_transfer(get_model(LARGE_MODEL), 10_000, get_link(INFINIBAND_NDR).bandwidth)
    return Bound(
        "04", MEMORY_BANDWIDTH,
        f"The {gpu.name}'s ridge point is {ridge_point(gpu):.0f} FLOPs per byte: a 2,048-token prefill does "
        f"{prefill.arithmetic_intensity:,.0f} (compute-bound), a batch-1 decode {decode.arithmetic_intensity:.1f} "
        f"(bandwidth-bound). Drafts accepted at 0.8 with k = 4 give {tokens:.2f} tokens per weight read; shipping "
        f"10,000 tokens of {LARGE_MODEL} KV between pools is {transfer.bytes / 1e9:.2f} GB, {_ms(transfer.time_s)}.",
        "speculative decoding (spend the idle compute of decode); disaggregated prefill and decode pools",
        {"ridge_point": ridge_point(gpu), "prefill_intensity": prefill.arithmetic_intensity,
         "decode_intensity": decode.arithmetic_intensity, "tokens_per_step": tokens,
         "kv_transfer_bytes": transfer.bytes, "kv_transfer_s": transfer.time_s})


def collectives(num_ranks: int = 8, size: int = 2**30) -> Bound:
    nvlink = get_link(NVLINK_4)
    seconds = RING.time(num_ranks, size, 0.0, nvlink.beta)
    return Bound(
        "05", INTERCONNECT_BANDWIDTH,
        f"An all-reduce is a reduce-scatter plus an all-gather: each of {num_ranks} ranks sends "
        f"{RING.volume(num_ranks):.2f}x the message, so 1 GiB of gradients takes {_ms(seconds)} at "
        f"{nvlink.bandwidth / 1e9:.0f} GB/s each way.",
        "the collective that moves the fewest bytes for the parallelism (reduce-scatter for FSDP, all-to-all for "
        "MoE), called by every rank in the same order",
        {"ring_volume": RING.volume(num_ranks), "all_reduce_s": seconds})


def ring_vs_tree(num_ranks: int = 512, size: int = 4096) -> Bound:
    ib = get_link(INFINIBAND_NDR)
    ring = RING.time(num_ranks, size, ib.alpha_s, ib.beta)
    tree = DOUBLE_BINARY_TREE.time(num_ranks, size, ib.alpha_s, ib.beta, TREE_CHUNK_BYTES)
    # the same tree, pipelined in the same chunks, as the time above and lesson 06's widget
    crossover = crossover_bytes(DOUBLE_BINARY_TREE, RING, num_ranks, ib.alpha_s, ib.beta, TREE_CHUNK_BYTES)
    return Bound(
        "06", LATENCY,
        f"4 KiB on {num_ranks} GPUs over InfiniBand: the ring's {2 * (num_ranks - 1):,} hops take "
        f"{format_duration(ring)}, a double binary tree {format_duration(tree)} ({ring / tree:.0f}x less); the "
        f"ring overtakes that tree, pipelined in {format_bytes(TREE_CHUNK_BYTES, whole=True)} chunks, only above "
        f"{format_bytes(crossover)}.",
        "trees (double binary trees) for small messages on many ranks, the ring for large ones",
        {"ring_s": ring, "tree_s": tree, "crossover_bytes": crossover})


def nccl_topology(size: int = 25 * MiB) -> Bound:
    nvlink, ib = get_link(NVLINK_4), get_link(INFINIBAND_NDR)
    cluster = topology.h100_cluster(2, 8, nics_per_node=1)
    flat = topology.flat_ring_crossing(cluster, size).busiest_nic
    hierarchical = topology.hierarchical_crossing(cluster, size).busiest_nic
    return Bound(
        "07", INTERCONNECT_BANDWIDTH,
        f"NVLink carries {nvlink.bandwidth / 1e9:.0f} GB/s each way, one InfiniBand NDR NIC "
        f"{ib.bandwidth / 1e9:.0f} GB/s ({nvlink.bandwidth / ib.bandwidth:.0f}x less). A 25 MiB bucket on two nodes "
        f"of 8 with one NIC each: a flat ring pushes {format_bytes(flat)} through a NIC, a hierarchical all-reduce "
        f"{format_bytes(hierarchical)}.",
        "hierarchical all-reduce, DDP's buckets overlapped with the backward pass, busbw measured against the "
        "link's peak, tensor parallelism kept inside the node",
        {"nvlink_bandwidth": nvlink.bandwidth, "nic_bandwidth": ib.bandwidth, "flat_nic_bytes": flat,
         "hierarchical_nic_bytes": hierarchical})


def fused_tp(num_ranks: int = 8, tokens: int = 16) -> Bound:
    model = get_model(LARGE_MODEL)
    size = tp_all_reduce.tp_message_bytes(tokens, model.hidden_size)
    per_step = tp_all_reduce.tp_all_reduces_per_forward(model.num_layers)
    times = {name: tp_all_reduce.all_reduce_time(name, num_ranks, size) * per_step for name in tp_all_reduce.TP_ALGORITHMS}
    best = tp_all_reduce.fastest(num_ranks, size)
    other = next(name for name in ("one-shot", "two-shot") if name != best)
    return Bound(
        "08", LATENCY,
        f"{model.name} at TP={num_ranks}, decoding {plural(tokens, 'sequence')}: {per_step} all-reduces of "
        f"{format_bytes(size)} per step, all on the critical path: {_ms(times['ring'])} with the ring, "
        f"{_ms(times[best])} {best} (the fastest at this size; {other} {_ms(times[other])}).",
        "all-reduce over symmetric memory, one-shot for the smallest messages and two-shot above the crossover K*; "
        "the reduction fused with the residual add and RMSNorm",
        {"message_bytes": size, "all_reduces_per_step": per_step, "ring_s": times["ring"],
         "one_shot_s": times["one-shot"], "two_shot_s": times["two-shot"], "fastest_s": times[best]})


def quantization() -> Bound:
    model, gpu = get_model(LARGE_MODEL), get_gpu(GPU_NAME)
    bf16, w4 = quant_cost.weight_memory(model, "BF16"), quant_cost.weight_memory(model, "W4A16")
    w4_checkpoint = quant_cost.weight_memory(model, "W4A16", quantized_embeddings=False)
    gpus_bf16 = quant_cost.min_gpus_for_weights(model, "BF16", gpu)
    gpus_w4 = quant_cost.min_gpus_for_weights(model, "W4A16", gpu)
    gpus_w4_checkpoint = quant_cost.min_gpus_for_weights(model, "W4A16", gpu, quantized_embeddings=False)
    best = quant_cost.best_scheme(model, gpu, 1)
    crossover = quant_cost.crossover_batch(model, gpu)
    return Bound(
        "09", MEMORY_BANDWIDTH,
        f"{model.name}'s weights are {bf16 / 1e9:.1f} GB in BF16 ({gpus_bf16} H100s before any KV cache); in "
        f"W4A16 {w4 / 1e9:.1f} GB with every weight quantized ({gpus_w4}), about {w4_checkpoint / 1e9:.1f} GB as "
        f"checkpoints ship it, embeddings and lm_head in 16 bits ({gpus_w4_checkpoint}). At batch 1 {best} is "
        f"fastest; FP8 W8A8 overtakes it from batch {crossover}, once W4A16's step is compute-bound on the BF16 "
        "tensor cores.",
        "weight-only 4-bit (W4A16) for bandwidth-bound small batches, FP8 W8A8 for compute-bound throughput, "
        "both behind an accuracy gate",
        {"bf16_bytes": bf16, "w4a16_bytes": w4, "w4a16_checkpoint_bytes": w4_checkpoint, "bf16_gpus": gpus_bf16,
         "w4a16_gpus": gpus_w4, "w4a16_checkpoint_gpus": gpus_w4_checkpoint, "fp8_crossover_batch": crossover},
        aspect="quantization")


def kv_offload(tokens: int = 10_100) -> Bound:
    model, gpu = get_model(SMALL_MODEL), get_gpu(GPU_NAME)
    tier = kv_tiers.get_tier(kv_tiers.CPU_DRAM)
    size = kv_tiers.reload_bytes(model, tokens)
    reload = kv_tiers.reload_time(model, tokens, tier)
    recompute = kv_tiers.recompute_time(model, tokens, gpu, flops=RECOMPUTE_FLOPS)
    return Bound(
        "09", KV_MEMORY,
        f"A {tokens:,}-token prefix of {model.name} is {size / 1e9:.2f} GB of KV: {_ms(reload)} to reload from CPU "
        f"memory against {recompute:.2f} s to recompute, {recompute / reload:.0f}x slower.",
        "KV offload tiers (CPU memory, NVMe, shared pools) with DMA copies; reload rather than recompute long "
        "prefixes",
        {"kv_bytes": size, "reload_s": reload, "recompute_s": recompute}, aspect="KV offload")


def resource_map() -> list[Bound]:
    """Every module's row, 01 to 09 in order (module 09 has two: quantization and KV offload)."""
    return [paging(), batching(), scheduler(), roofline(), collectives(), ring_vs_tree(), nccl_topology(),
            fused_tp(), quantization(), kv_offload()]


def as_markdown(rows: list[Bound], link_prefix: str = "") -> str:
    """A Markdown table of ``rows``, each module's outline title linking to ``link_prefix + lesson``,
    followed by the row's aspect, if any."""
    lines = ["| module | what bounds you | the numbers | what relieves it |", "|---|---|---|---|"]
    for row in rows:
        name = f"[{row.module} {row.title}]({link_prefix}{row.lesson})" + (f": {row.aspect}" if row.aspect else "")
        cells = (name, f"**{row.resource}**", row.evidence, row.technique)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def figures_text(rows: list[Bound], width: int = 96) -> str:
    """Each row's figures as the cost models returned them, to four significant digits, never in
    e-notation: seconds (names ending ``_s``) in the unit that fits, the rest as plain numbers. A
    row's figures are wrapped between figures, never inside one, in lines of at most ``width``
    (a single figure longer than that keeps a line of its own)."""
    lines = []
    for row in rows:
        items = [f"{name} = {format_duration(value, 4) if name.endswith('_s') else format_number(value, 4)}"
                 for name, value in row.figures.items()]
        items = [item + "," for item in items[:-1]] + items[-1:]
        line, fresh = f"{row.module} {row.resource:22}", True
        for item in items:
            if not fresh and len(line) + 1 + len(item) > width:
                lines.append(line)
                line = " " * 25
            line, fresh = f"{line} {item}", False
        lines.append(line)
    return "\n".join(lines)


@dataclass(frozen=True)
class StaffQuestion:
    """An open question with a model ("staff") answer and what to compare in one's own answer;
    ``lesson`` is the notebook that teaches it. Kept here rather than in the notebook's cells, so
    that the answer stays hidden until the learner has written theirs and asks for it."""

    key: str
    topic: str
    lesson: str
    question: str
    answer: str
    compare: str


STAFF_QUESTIONS: tuple[StaffQuestion, ...] = (
    StaffQuestion(
        'memory-bound-serving', 'Why serving is memory-bound', '01_paging.ipynb',
        'Why is LLM serving memory-bound, and how does vLLM fix it? Be ready for two follow-ups: how do GQA and '
        'MQA change the math, and what is left to optimise inside a block?',
        'Serving is bounded by KV memory, not FLOPs: decode reads the weights and the whole cache for every '
        "token, so throughput comes from batching, and the batch is capped by how many sequences' KV fits. A "
        'cache entry is 2 × layers × KV heads × head_dim × bytes per token; for Llama-3-8B in FP16 that is 128 '
        'KiB, 256 MiB for a 2k sequence. Pre-vLLM servers reserved max-length contiguous regions and wasted '
        '60–80% to over-reservation and fragmentation. PagedAttention stores KV in fixed 16-token blocks '
        'allocated on demand through a per-request block table, like OS pages, so waste drops below 4% (only the '
        'last partial block), batches get several times larger, and blocks can be shared by reference count with '
        'copy-on-write for parallel sampling. The block then becomes the unit for prefix caching, offload and KV '
        'transfer. The costs: one indirection in the attention kernel, and choosing a block size. On GQA and '
        'MQA: fewer KV heads, a proportionally smaller cache, so 32 → 8 heads is 4× more sequences. Left to '
        "optimise inside a block: only each request's last, partly filled block wastes space.",
        "did you say why decode is bound by KV memory rather than FLOPs, size a token's KV entry, say what "
        'reserve-for-max allocation wasted and how blocks handed out on demand through a block table fix it, and '
        "name both costs (the kernel's indirection and the block size)?"),
    StaffQuestion(
        'paging', 'Paging', '01_paging.ipynb',
        'What did PagedAttention change in how a server holds the KV cache, and what does it cost?',
        'It stores the KV cache in fixed-size blocks (16 tokens by default in vLLM), found through a block table '
        'per request and handed out as tokens arrive, which removed most of the fragmentation: the PagedAttention'
        ' paper measured 60-80% of KV memory wasted by reserve-for-max allocation and under 4% with paging. The '
        'block then became the unit of everything built on top: prefix hashing, sharing with copy-on-write, '
        'offload to CPU memory and KV transfer between prefill and decode. Its costs are one more indirection in '
        'the attention kernel and a block size to choose: small blocks reuse more finely but make every transfer '
        'tiny.',
        'did you name the block table and allocation on demand, say what the block made possible afterwards, and '
        "give both costs (the kernel's indirection and the block-size trade-off)?"),
    StaffQuestion(
        'continuous-batching', 'Continuous batching', '02_batching.ipynb',
        'Why does continuous batching beat static batching for LLM serving, and how is it different from '
        'PagedAttention?',
        'Static batching runs a group to completion, so every slot waits for the longest request, and LLM output '
        'lengths vary by orders of magnitude and are unknown until EOS. Continuous, iteration-level batching '
        'reschedules after every decode step: finished sequences leave, waiting ones join, and the GPU stays '
        'saturated. It is a scheduling technique; PagedAttention is the memory technique that lets many '
        'sequences fit. Together they give vLLM its 14-24x over HF Transformers. The batch is bounded by '
        'max_num_seqs and max_num_batched_tokens; it buys throughput, and under load individual latency can rise.',
        'did you name what makes static batching bad for LLMs (output lengths that vary widely and are unknown '
        'until EOS), say that continuous batching reschedules after every step, keep scheduling (batching) apart '
        'from memory (PagedAttention), and say what bounds the batch and what it can cost in latency?'),
    StaffQuestion(
        'v1-scheduler', 'The V1 scheduler', '03_scheduler.ipynb',
        "How does vLLM V1's scheduler decide what runs in a step, how do you pick its token budget, and what "
        'happens when the KV cache runs out or requests share a prefix?',
        'V1 treats a step as a token budget, {request_id: num_tokens}, so chunked prefill and mixing prefill '
        'with decode fall out naturally. Running requests are scheduled first, then waiting ones are admitted '
        'until the budget, max_num_seqs or the KV cache runs out. max_num_batched_tokens trades TTFT against '
        'ITL: a big budget finishes long prompts sooner but stalls every decoding user for the length of that '
        "step, so pick the largest budget whose worst gap during a long prefill (or each request's P99 over that "
        'window, not a whole-run P99, which dilutes a few long stalls among thousands of normal steps) meets '
        'your ITL target, and cap single requests with long_prefill_token_threshold. When blocks run out, the '
        'last running request is preempted; V1 only recomputes: the re-prefill is parallel work that shares '
        'steps with decodes, prefix caching often makes it mostly hits, and it needs no pinned CPU memory or '
        'copy scheduling. Thrashing (a rising preemption count) means admission is too generous: lower '
        'max_num_seqs or the budget, raise gpu_memory_utilization, keep prefix caching on, or add GPUs; with '
        'long prompts and caching off it can collapse throughput, because a preempted request is re-admitted '
        'chunk by chunk and preempts itself again. Prefix caching hashes full blocks in a chain, so hits need an '
        'identical prefix: keep volatile content at the end and route sessions consistently. cache_salt '
        'separates tenants, closing a timing side channel.',
        'did you describe a step as a token budget filled by running requests first, tie max_num_batched_tokens '
        'to TTFT against ITL through the worst gap during a long prefill, say why V1 preempts by recomputing and '
        'how to stop thrashing, and explain the prefix hash chain and what cache_salt protects?'),
    StaffQuestion(
        'prefix-caching', 'Prefix caching', '03_scheduler.ipynb',
        'How does prefix caching find a cached prefix, and what keeps its hit rate high in production?',
        "Every full block is hashed over its parent's hash and its own tokens, so one hash stands for the whole "
        'prefix up to that block; a new request walks its chain of hashes and reuses the longest cached run. The '
        'operational work is protecting the hit rate: stable prompt templates with the dynamic parts (timestamps,'
        ' user ids) at the end, routing that keeps a session on the replica holding its prefix, and hit rate '
        'tracked as a first-class SLO signal.',
        'did you explain why one early change misses every later block (the chain), and name at least two ways to'
        ' protect the hit rate: template order, cache-aware routing, monitoring?'),
    StaffQuestion(
        'scheduling', 'Scheduling', '03_scheduler.ipynb',
        "Long document prompts make chat users' token streams stutter. What is the dial, and why does priority "
        'scheduling alone not fix it?',
        'The per-step token budget is the main latency-throughput dial: a bigger budget finishes prefills sooner,'
        ' a smaller one bounds the step time that every decode waits on. With FIFO chunked prefill one long '
        'prompt can take the whole budget step after step and hold short turns back; capping the prefill tokens '
        'one request may take per step (long_prefill_token_threshold) bounds its share. Priority scheduling alone'
        ' does not help, because a prefill that is already running keeps consuming budget every step.',
        'did you name both knobs (the budget and the per-request cap), say which way each moves TTFT and ITL, and'
        ' why a running prefill defeats priorities?'),
    StaffQuestion(
        'disaggregation', 'Disaggregation', '04_roofline.ipynb',
        'When would you put prefill and decode on separate GPU pools, and how would you run them?',
        'Disaggregation runs prefill and decode in pools that scale independently, each with its own parallelism '
        'and kernels, and prefills stop interrupting decodes. It shapes latency; on its own it does not raise '
        "throughput (vLLM's documentation says so). The KV transfer becomes a networking problem: 10K tokens of "
        'Llama-70B are about 3.3 GB, about 65 ms at 50 GB/s unless sent layer by layer. So I would rate-match the'
        ' pools with saturation sweeps and autoscale each on its own signal: queue length and TTFT for prefill, '
        'KV usage and ITL for decode. It pays for long prompts at scale and MoE deployments, not for short '
        'prompts or small fleets.',
        'did you say it buys latency control rather than throughput, size the KV transfer, and give each pool its'
        ' own scaling signal?'),
    StaffQuestion(
        'speculative-decoding', 'Speculative decoding', '04_roofline.ipynb',
        'Your team wants speculative decoding on everywhere. What do you say?',
        "It spends decode's idle compute to emit several tokens per read of the weights, and rejection sampling "
        "keeps the output distribution exactly the target model's. Whether it pays depends on load: verification "
        'is only nearly free while decode is memory-bound. Llama-3-70B on four H100s with a draft model ran 1.5x '
        'faster at QPS 1 and 1.4x slower at high QPS, where batches are already compute-bound. So I would gate it'
        ' by load and by route: on for latency-sensitive routes and the decode pool, acceptance rate watched per '
        'draft position, and TPOT benchmarked at real concurrency, never only at QPS 1.',
        'did you say why it is lossless, why it stops paying under load (compute-bound batches), and how you '
        'would gate and measure it?'),
    StaffQuestion(
        'collectives-behind-parallelism', 'Collectives behind parallelism', '05_collectives.ipynb',
        'Which collective does each parallelism strategy rely on, and what must every rank get right when it '
        'calls one?',
        'Every parallelism strategy is a choice of collective. DDP averages gradients with one all-reduce per '
        'step; FSDP splits that all-reduce into a reduce-scatter of gradients and an all-gather of parameters '
        'just in time; tensor parallelism needs one all-reduce per block in forward and one in backward; MoE '
        'dispatches and combines tokens with two all-to-alls, because summing would mix different tokens; '
        'pipeline parallelism passes activations point to point. AllReduce = ReduceScatter + AllGather = Reduce '
        '+ Broadcast. Collectives must be called symmetrically, same order and shapes on every rank, or the job '
        'hangs, crashes or corrupts data.',
        'did you name the collective behind DDP, FSDP, tensor parallelism, MoE and pipeline parallelism, give '
        'both all-reduce identities, and say why every rank must call the same collectives in the same order '
        'with the same shapes?'),
    StaffQuestion(
        'ring-or-tree', 'Ring or tree', '06_ring_vs_tree.ipynb',
        'How does ring all-reduce work, what does it cost, and when does a tree beat it?',
        'Ring all-reduce is a reduce-scatter then an all-gather around a ring of N GPUs, N-1 steps each, sending '
        'K/N per step: 2(N-1)/N·K bytes per GPU, under 2K whatever N is, so it is bandwidth-optimal and limited '
        'by the slowest neighbour link. But it pays 2(N-1) serial start-ups, so its latency is linear in N: cost '
        '2(N-1)α + 2(N-1)/N·Kβ. A tree reduces up and broadcasts down in 2·log2 N hops, which wins for small '
        "messages on many GPUs, like 4 KB across 512, where the ring's thousand hops dominate. A single tree "
        'wastes half its links, so NCCL uses two mirrored binary trees for ring-like bandwidth with log-N '
        'latency, and picks ring or tree by message size and world size automatically.',
        "did you give the ring's two phases and its 2(N-1)/N·K bytes per GPU, its alpha-beta cost with 2(N-1) "
        "start-ups, the tree's 2·log2 N hops, and why NCCL runs two mirrored trees and switches by message size "
        'and GPU count?'),
    StaffQuestion(
        'dp-at-scale', 'Data parallelism at scale', '07_nccl_topology.ipynb',
        'Data-parallel training scales well to 8 GPUs, but throughput per GPU collapses at 512. How do you diagnose '
        'it?',
        'I would apply the communication roofline test: t_comm for the gradient all-reduce (the bytes each GPU sends '
        'over the busbw of the link that paces it) against the backward pass it must hide behind. Past one node every '
        'ring step crosses InfiniBand: little bandwidth is lost if there is a NIC per GPU, a lot if the nodes have few '
        "NICs, and a ring's latency, 2(N-1) hops per bucket, grows linearly with N. At 512 GPUs t_comm exceeds "
        'backward and overlap cannot hide it. I would measure busbw across nodes with nccl-tests, then make sure NCCL '
        'uses trees at that scale, use bigger buckets, more tokens per GPU (gradient accumulation), fewer gradient '
        'bytes, or sharded data parallelism.',
        'did you compare communication with the compute it overlaps, name what changes at the node boundary (hops, '
        'NICs) and the latency that grows with N, and propose fixes that act on those terms?'),
    StaffQuestion(
        'column-then-row', 'Column, then row', '08_fused_tp.ipynb',
        'Why split the first MLP matmul by columns and the second by rows?',
        'Because the activation between them is elementwise but not linear. Splitting the first weight by columns '
        'gives each GPU complete values of its share of the hidden features, so GeLU is exact locally; those features '
        'are what the matching rows of the second weight multiply, so each GPU produces a partial sum of the output '
        'and one all-reduce finishes the block. The conjugate operators make it one all-reduce forward (g) and one '
        'backward (f). The other order leaves partial sums before the nonlinearity and needs a collective there too.',
        'did you say why the nonlinearity forces the first split, why the second split needs no communication before '
        'it, and count the all-reduces forward and backward?'),
    StaffQuestion(
        'fused-all-reduce', 'Fused all-reduce for TP', '08_fused_tp.ipynb',
        'Why do fused one-shot and two-shot all-reduce kernels matter for tensor parallelism but not for DDP?',
        "TP's all-reduces are small (one activation per layer), latency-bound and on the critical path: the next "
        "layer needs the result, so nothing overlaps them, and a ring's 2(N-1) rounds and separate kernel launches "
        'dominate. Over symmetric memory, one-shot takes one round and reads every peer\'s whole buffer, which wins '
        'the smallest messages; two-shot takes two rounds and moves only the ring\'s bytes, which wins above a '
        'crossover size that falls as the group grows. Fusing the residual add and norm removes launches and '
        "memory round trips. DDP's buckets are large and overlap the backward pass, so the bandwidth-optimal ring "
        'is right.',
        'did you name message size, latency and the critical path for TP, say which of one- and two-shot wins '
        'where, and name overlap and bandwidth for DDP?'),
    StaffQuestion(
        'quantization', 'Quantization', '09_serving_tradeoffs.ipynb',
        'Which quantization scheme would you ship for a model, and what must it pass first?',
        'I match the scheme to the bottleneck at the operating point. Weight-only 4-bit (W4A16, with mixed-input '
        'kernels such as Marlin or Machete) moves the fewest bytes, so it wins latency-bound small batches; FP8 '
        'W8A8 runs on FP8 tensor cores at twice the BF16 peak, so it wins compute-bound throughput (Hopper or Ada'
        ' needed). Nothing ships without two gates on our own workload: accuracy against the BF16 baseline, '
        'broken out by task and context length, with tool-call and JSON validity checked; and performance at real'
        ' concurrency.',
        'did you tie each scheme to a bound (bytes at small batch, FLOPs at large), and name both gates, accuracy'
        ' by task and context length and speed at real load?'),
    StaffQuestion(
        'reload-or-recompute', 'Reload or recompute', '09_serving_tradeoffs.ipynb',
        "A prefix's KV cache has been pushed out of GPU memory to the CPU. Do you copy it back or recompute it?",
        'Compare the transfer time with the prefill time. For Llama-3.1-8B, 10K tokens of KV are about 1.3 GB: '
        'roughly 26 ms from CPU memory, against about 0.3 s to recompute on an H100, so reloading wins about '
        'tenfold, and the gap widens with context because the copy grows linearly while prefill adds a quadratic '
        'attention term. The copy runs on the DMA engines, so it does not take SMs from the model. Below a few '
        'hundred tokens fixed overheads dominate and recomputing is simpler.',
        'did you put numbers on both sides (bytes over the link, FLOPs on the GPU), say which way the gap moves '
        'with length, and where recomputing is the better choice?'),
    StaffQuestion(
        'through-line', 'The through-line', '10_review.ipynb',
        'A service you have never seen is too slow or too expensive. How do you start?',
        'By naming the resource that bounds it before choosing a technique: measure where the time goes and put '
        'each phase on its roofline. If KV memory limits the batch, page it, cache and share prefixes, offload it'
        ' or shrink it (GQA, FP8 KV); if decode is bandwidth-bound, batch more, quantize the weights, or '
        'speculate; if prefill or big batches are compute-bound, chunk prefills, disaggregate, or move to FP8; if'
        ' GPUs wait on each other, check busbw against the link and keep tensor parallelism on NVLink; if small '
        'fixed costs dominate, cut rounds (trees; one- or two-shot all-reduce, by message size) and fuse kernels. '
        'Then measure again at '
        'real concurrency, since fixing one bound exposes the next.',
        'did you start by measuring, name a bound before a technique, cover all four resources, and end with '
        'measuring again?'),
)
"""The staff answers in the order the course teaches them, then the question the whole course builds
towards. Each lesson shows its own; the final review asks seven: 04's and 09's again, and 'paging',
'prefix-caching' and 'scheduling', shorter questions on what 01 and 03 teach that only the review shows."""


def staff_question(key: str) -> StaffQuestion:
    """The staff question named ``key``; the error lists the known keys."""
    for question in STAFF_QUESTIONS:
        if question.key == key:
            return question
    raise KeyError(f"No staff question {key!r}; choose one of {[q.key for q in STAFF_QUESTIONS]}.")
