"""A planted cohort for the similarity report (tests/grading/test_similarity.py): honest learners who
wrote exercises 01 and 04 each in their own way, and copiers of the course solution and of each
other, verbatim and disguised (renamed, reformatted, re-commented, reordered, padded).
``PLANTED`` lists the pairs the report must flag, nothing else.

Each answer is the body that replaces the starter's ``raise NotImplementedError(...)`` line, or a
whole cell (``CELL:`` first) where the learner rewrote the signature too.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from course_lib.exercise_files import course_exercise, exercise_file, solution_file
from course_lib.paths import REPO_ROOT

PAGING, ROOFLINE = "01_paging", "04_roofline"
TODO = 'raise NotImplementedError("Your code here: replace this line (see the task above).")'

# --- honest learners: each wrote every answer on their own ---------------------------------------

HONEST = {
    "ana": {
        PAGING: [
            "return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes",
            """usable = gpu_memory_bytes * gpu_memory_utilization
    free = usable - weight_bytes - activation_bytes
    if free <= 0:
        return 0
    return int(free // block_bytes)""",
            """import math
    slots = 0
    used = 0
    for length in lengths:
        blocks = math.ceil(length / block_size)
        slots += blocks * block_size
        used += length
    return (slots - used) / slots""",
            """full_prompt_blocks = prompt_len // block_size
    total_per_sample = -(-(prompt_len + output_len) // block_size)
    own = total_per_sample - full_prompt_blocks
    return full_prompt_blocks + own * num_samples""",
        ],
        ROOFLINE: [
            """model = get_model(model_name)
    gpu = get_gpu(gpu_name)
    new_total = 0
    context = 0
    pairs = 0
    for cached, new in requests:
        new_total += new
        context += cached + new
        pairs += new * cached + new * (new + 1) // 2
    flops = 2 * model.active_params * new_total + 4 * model.num_layers * model.num_heads * model.head_dim * pairs
    kv_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
    nbytes = 2 * model.num_params + kv_per_token * (context + new_total)
    intensity = flops / nbytes
    ridge = gpu.bf16_flops / gpu.hbm_bandwidth
    bound = "compute" if intensity >= ridge else "memory"
    return {"flops": flops, "bytes": nbytes, "intensity": intensity, "bound": bound}""",
            """out = []
    for i, d in enumerate(draft_token_ids):
        out.append(target_argmax_ids[i])
        if d != target_argmax_ids[i]:
            return out
    out.append(target_argmax_ids[-1])
    return out""",
            """u = torch.rand(1, generator=generator).item()
    accept_prob = (target_probs[draft_token] / draft_probs[draft_token]).item()
    if u < accept_prob:
        return draft_token
    residual = (target_probs - draft_probs).clamp(min=0.0)
    residual = residual / residual.sum()
    token = torch.multinomial(residual, num_samples=1, generator=generator)
    return token.item()""",
            """tokens_per_s = num_seqs / tpot_s
    requests_per_s = tokens_per_s / output_len
    return {"decode_tokens_per_s": tokens_per_s, "decode_requests_per_s": requests_per_s,
            "prefill_per_decode": requests_per_s / prefill_requests_per_s}""",
        ],
    },
    "ben": {
        PAGING: [
            """per_layer = num_kv_heads * head_dim * dtype_bytes  # one of K or V
    return per_layer * 2 * num_layers""",
            """budget = gpu_memory_utilization * gpu_memory_bytes - (weight_bytes + activation_bytes)
    n = int(budget // block_bytes)
    return n if n > 0 else 0""",
            """empty = 0
    total = 0
    for n in lengths:
        full, rest = divmod(n, block_size)
        blocks = full + (1 if rest else 0)
        total += blocks * block_size
        empty += blocks * block_size - n
    return empty / total""",
            """shared, partial = divmod(prompt_len, block_size)
    # each sample owns the partial block (copy-on-write) plus the blocks its output needs
    tokens_per_sample = partial + output_len
    own_blocks = -(-tokens_per_sample // block_size)
    return shared + num_samples * own_blocks""",
        ],
        ROOFLINE: [
            """m = get_model(model_name)
    g = get_gpu(gpu_name)

    def attended(cached, new):
        return sum(cached + i + 1 for i in range(new))

    linear = 2 * m.active_params * sum(n for _, n in requests)
    attention = 4 * m.num_layers * m.num_heads * m.head_dim * sum(attended(c, n) for c, n in requests)
    flops = linear + attention
    bytes_per_token = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2
    kv_read = sum(c + n for c, n in requests) * bytes_per_token
    kv_written = sum(n for _, n in requests) * bytes_per_token
    moved = 2 * m.num_params + kv_read + kv_written
    result = {"flops": flops, "bytes": moved, "intensity": flops / moved}
    result["bound"] = "memory" if result["intensity"] < g.bf16_flops / g.hbm_bandwidth else "compute"
    return result""",
            """k = 0
    while k < len(draft_token_ids) and draft_token_ids[k] == target_argmax_ids[k]:
        k += 1
    return list(target_argmax_ids[:k + 1])""",
            """ratio = float(target_probs[draft_token]) / float(draft_probs[draft_token])
    if torch.rand((), generator=generator).item() < ratio:
        return int(draft_token)
    diff = torch.maximum(target_probs - draft_probs, torch.zeros_like(target_probs))
    return int(torch.multinomial(diff / diff.sum(), 1, generator=generator)[0])""",
            """rates = {}
    rates["decode_tokens_per_s"] = num_seqs / tpot_s
    rates["decode_requests_per_s"] = rates["decode_tokens_per_s"] / output_len
    rates["prefill_per_decode"] = rates["decode_requests_per_s"] / prefill_requests_per_s
    return rates""",
        ],
    },
    "chen": {
        PAGING: [
            """k = num_layers*num_kv_heads*head_dim*dtype_bytes
    v = k
    return k + v""",
            """return max(0, int((gpu_memory_utilization * gpu_memory_bytes - weight_bytes - activation_bytes)
                        // block_bytes))""",
            """held_blocks = [(l + block_size - 1) // block_size for l in lengths]
    held_slots = block_size * sum(held_blocks)
    return 1 - sum(lengths) / held_slots""",
            """blocks = prompt_len // block_size
    tail = prompt_len % block_size
    for _ in range(num_samples):
        blocks += (tail + output_len + block_size - 1) // block_size
    return blocks""",
        ],
        ROOFLINE: [
            """spec = get_model(model_name)
    hw = get_gpu(gpu_name)
    cached = [r[0] for r in requests]
    new = [r[1] for r in requests]
    total_new = sum(new)
    n_pairs = 0
    for c, n in zip(cached, new):
        n_pairs += n * c + n * (n + 1) // 2
    dims = spec.num_layers * spec.head_dim
    flops = 2 * spec.active_params * total_new + 4 * dims * spec.num_heads * n_pairs
    kv_token_bytes = 4 * dims * spec.num_kv_heads
    byte_count = 2 * spec.num_params + kv_token_bytes * (sum(cached) + 2 * total_new)
    ai = flops / byte_count
    return dict(flops=flops, bytes=byte_count, intensity=ai,
                bound="compute" if ai >= hw.bf16_flops / hw.hbm_bandwidth else "memory")""",
            """import itertools
    accepted = list(itertools.takewhile(lambda pair: pair[0] == pair[1], zip(draft_token_ids, target_argmax_ids)))
    return [d for d, _ in accepted] + [target_argmax_ids[len(accepted)]]""",
            """p_x = target_probs[draft_token]
    q_x = draft_probs[draft_token]
    draw = torch.rand(1, generator=generator)[0]
    if draw * q_x < p_x:
        return draft_token
    leftover = torch.relu(target_probs - draft_probs)
    pick = torch.multinomial(leftover / torch.sum(leftover), 1, generator=generator)
    return int(pick)""",
            """tok = num_seqs / tpot_s
    req = tok / output_len
    return dict(decode_tokens_per_s=tok, decode_requests_per_s=req, prefill_per_decode=req / prefill_requests_per_s)""",
        ],
    },
    "dara": {
        PAGING: [
            "return num_layers * 2 * num_kv_heads * head_dim * dtype_bytes",
            """total = gpu_memory_utilization * gpu_memory_bytes
    kv_space = total - weight_bytes - activation_bytes
    return int(kv_space // block_bytes) if kv_space > 0 else 0""",
            """waste = sum((block_size - n % block_size) % block_size for n in lengths)
    return waste / (waste + sum(lengths))""",
            """prompt_blocks_full = prompt_len // block_size
    blocks_each = (prompt_len + output_len + block_size - 1) // block_size
    return prompt_blocks_full + num_samples * (blocks_each - prompt_blocks_full)""",
        ],
        ROOFLINE: [
            """model, gpu = get_model(model_name), get_gpu(gpu_name)
    flops = 0
    moved = 2 * model.num_params
    kv = 4 * model.num_layers * model.num_kv_heads * model.head_dim
    for cached_tokens, new_tokens in requests:
        flops += 2 * model.active_params * new_tokens
        for i in range(new_tokens):
            flops += 4 * model.num_layers * model.num_heads * model.head_dim * (cached_tokens + i + 1)
        moved += kv * (cached_tokens + 2 * new_tokens)
    ridge = gpu.bf16_flops / gpu.hbm_bandwidth
    return {"flops": flops, "bytes": moved, "intensity": flops / moved,
            "bound": "memory" if flops / moved < ridge else "compute"}""",
            """result = []
    for position in range(len(draft_token_ids)):
        if draft_token_ids[position] == target_argmax_ids[position]:
            result.append(draft_token_ids[position])
        else:
            result.append(target_argmax_ids[position])
            break
    else:
        result.append(target_argmax_ids[len(draft_token_ids)])
    return result""",
            """accept = min(1.0, (target_probs[draft_token] / draft_probs[draft_token]).item())
    if torch.rand(1, generator=generator).item() < accept:
        return int(draft_token)
    weights = torch.where(target_probs > draft_probs, target_probs - draft_probs, torch.zeros_like(target_probs))
    return int(torch.multinomial(weights, 1, generator=generator).item())""",
            """decode_tps = num_seqs / tpot_s
    decode_rps = decode_tps / output_len
    ratio = decode_rps / prefill_requests_per_s
    return {"decode_tokens_per_s": decode_tps, "decode_requests_per_s": decode_rps, "prefill_per_decode": ratio}""",
        ],
    },
}

# --- copiers --------------------------------------------------------------------------------------

SOLUTION_CELL = "SOLUTION"  # the course solution's cell, verbatim

COPIERS = {
    # pasted the course solution into every cell, markers and all
    "vera": {PAGING: [SOLUTION_CELL] * 4, ROOFLINE: [SOLUTION_CELL] * 4},
    # the solution of 04's tasks 1 and 3, renamed, reformatted, re-commented, statements reordered
    "rene": {
        ROOFLINE: [
            '''CELL:# Your code
def step_intensity(model_name, gpu_name, requests):
    """My roofline step: returns the FLOPs, the bytes, the intensity and the bound."""
    # look up the hardware first, then the model
    m, hw = get_model(model_name), get_gpu(gpu_name)
    ctx = sum(c + n for c, n in requests)   # tokens whose KV is read
    n_new = sum(n for _, n in requests)     # tokens computed in this step
    attended_pairs = sum(n * c + n * (n + 1) // 2
                         for c, n in requests)
    f = (2 * m.active_params * n_new +
         4 * m.num_layers * m.num_heads * m.head_dim * attended_pairs)
    per_tok = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2  # K and V, bf16
    traffic = 2 * m.num_params + per_tok * (ctx + n_new)
    ai = f / traffic
    ridge = hw.bf16_flops / hw.hbm_bandwidth
    return {'flops': f, 'bytes': traffic, 'intensity': ai,
            'bound': 'compute' if ai >= ridge else 'memory'}
''',
            None,
            """# accept or resample
    P, Q, tok = target_probs, draft_probs, draft_token
    if float(torch.rand(1, generator=generator)) < min(1., float(P[tok] / Q[tok])):
        return tok
    # leftover mass where the target wants more than the draft gave
    r = torch.clamp(P - Q, min=0)
    return int(torch.multinomial(r / r.sum(), 1, generator=generator))""",
            None,
        ],
    },
    # copied chen's 04 task 1 cell verbatim, and dara's verify_greedy with new names and comments
    "gus": {
        ROOFLINE: [
            "FROM:chen",
            """# walk the drafts, stop at the first miss
    toks = []
    for idx in range(len(draft_token_ids)):
        if draft_token_ids[idx] == target_argmax_ids[idx]:
            toks.append(draft_token_ids[idx])   # accepted
        else:
            toks.append(target_argmax_ids[idx])  # the target's own token
            break
    else:
        toks.append(target_argmax_ids[len(draft_token_ids)])  # bonus
    return toks""",
            None,
            None,
        ],
    },
}

COPIERS["pia"] = {  # the solution of 04's tasks 2 and 3, padded with checks, a helper and trial prints of her own
    ROOFLINE: [
        None,
        '''CELL:# Your code
def verify_greedy(draft_token_ids, target_argmax_ids):
    """The tokens one greedy verification step emits."""
    assert len(target_argmax_ids) == len(draft_token_ids) + 1, "need k + 1 target choices"
    if not draft_token_ids:
        return [target_argmax_ids[0]]
    emitted = []
    for draft, target in zip(draft_token_ids, target_argmax_ids):
        if draft != target:
            break
        emitted.append(draft)
    return emitted + [target_argmax_ids[len(emitted)]]


print(verify_greedy([1, 2, 3], [1, 2, 4, 5]))
print(verify_greedy([7, 8], [7, 8, 9]))
print(verify_greedy([], [4]))
''',
        '''CELL:# Your code
def _is_distribution(probs):
    return probs.dim() == 1 and bool((probs >= 0).all()) and abs(float(probs.sum()) - 1.0) < 1e-4


def rejection_step(target_probs, draft_probs, draft_token, generator):
    """The token one rejection-sampling step emits for the draft ``draft_token``."""
    assert _is_distribution(target_probs) and _is_distribution(draft_probs)
    assert 0 <= draft_token < len(target_probs), "the draft is not in the vocabulary"
    p, q, x = target_probs, draft_probs, draft_token
    if float(torch.rand(1, generator=generator)) < min(1.0, float(p[x] / q[x])):
        return x
    residual = torch.clamp(p - q, min=0)
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


g = torch.Generator().manual_seed(0)
print([rejection_step(torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1]), 0, g) for _ in range(10)])
''',
        None,
    ],
}

# the pairs the report must flag: (exercise, task number, learner, other learner or "course solution")
PLANTED = {
    (ROOFLINE, 1, "vera", "course solution"),
    (ROOFLINE, 2, "vera", "course solution"),
    (ROOFLINE, 3, "vera", "course solution"),
    (ROOFLINE, 1, "rene", "course solution"),
    (ROOFLINE, 1, "rene", "vera"),
    (ROOFLINE, 3, "rene", "course solution"),
    (ROOFLINE, 3, "rene", "vera"),
    (ROOFLINE, 1, "chen", "gus"),
    (ROOFLINE, 2, "dara", "gus"),
    (ROOFLINE, 2, "pia", "course solution"),
    (ROOFLINE, 2, "pia", "vera"),
    (ROOFLINE, 3, "pia", "course solution"),
    (ROOFLINE, 3, "pia", "rene"),
    (ROOFLINE, 3, "pia", "vera"),
}


def student_cells(book):
    return [cell for cell in book.cells if "student" in cell.metadata.get("tags", [])]


def _cells(module: str) -> tuple[list[str], list[str]]:
    starter = [cell.source for cell in student_cells(nbformat.read(course_exercise(module), as_version=4))]
    solution = [cell.source for cell in
                student_cells(nbformat.read(REPO_ROOT / "solutions" / solution_file(module), as_version=4))]
    return starter, solution


def answer_cell(starter: str, answer: str) -> str:
    """The *Your code* cell with ``answer`` in place of the starter's ``raise`` line."""
    if answer.startswith("CELL:"):
        return answer.removeprefix("CELL:")
    assert TODO in starter
    return starter.replace(TODO, answer)


def write_cohort(root: Path) -> dict[str, dict[str, list[str]]]:
    """Write every learner's two notebooks under ``root/<learner>/``; return each learner's cells."""
    cells: dict[str, dict[str, list[str]]] = {}
    for learner in sorted(HONEST):
        cells[learner] = {module: [answer_cell(s, a) for s, a in zip(_cells(module)[0], answers)]
                          for module, answers in HONEST[learner].items()}
    for learner, modules in sorted(COPIERS.items()):
        cells[learner] = {}
        for module in (PAGING, ROOFLINE):
            starter, solution = _cells(module)
            answers = modules.get(module, [None] * len(starter))
            own = []
            for index, answer in enumerate(answers):
                if answer is None:
                    own.append(starter[index])  # not done
                elif answer == SOLUTION_CELL:
                    own.append(solution[index])
                elif answer.startswith("FROM:"):
                    own.append(cells[answer.removeprefix("FROM:")][module][index])
                else:
                    own.append(answer_cell(starter[index], answer))
            cells[learner][module] = own
    for learner, modules in cells.items():
        for module, sources in modules.items():
            book = nbformat.read(course_exercise(module), as_version=4)
            for cell, source in zip(student_cells(book), sources):
                cell.source = source
            (root / learner).mkdir(parents=True, exist_ok=True)
            nbformat.write(book, root / learner / exercise_file(module))
    return cells
