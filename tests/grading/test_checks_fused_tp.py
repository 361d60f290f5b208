"""Exercise 08's tasks against solutions in other styles (they must pass) and against the mistake
each stated rule is there to catch (each must fail on the case built for that rule, with its hint).
Tasks 1 and 2 run on real ranks and are judged also by the torch.distributed calls the function
made; Task 3 also runs an expert-parallel forward on real ranks with the learner's split sizes."""

import pytest
import torch
import torch.distributed as dist

from course_lib.collectives import moe
from course_lib.collectives.launch import run_on_ranks
from course_lib.grading.checks import exercise_tasks
from course_lib.grading.checks.fused_tp import dispatch_split_sizes, moe_expected, rank_weights
from course_lib.grading.task import expected_values
from test_checks import caught_mistake, function_name, verdict

EXERCISE = "08_fused_tp"

ALTERNATIVES = [
    """
    def tensor_parallel_mlp(x, a, b):
        # the course's own layers, built from full-size Linear layers (weight = a.T, b.T)
        from torch import nn
        from course_lib.collectives.tensor_parallel import ColumnParallelLinear, RowParallelLinear
        rank, world = dist.get_rank(), dist.get_world_size()
        up, down = nn.Linear(a.shape[0], a.shape[1], bias=False), nn.Linear(b.shape[0], b.shape[1], bias=False)
        with torch.no_grad():
            up.weight.copy_(a.T)
            down.weight.copy_(b.T)
            return RowParallelLinear(down, rank, world)(F.gelu(ColumnParallelLinear(up, rank, world)(x)))
    """,
    """
    def tensor_parallel_mlp(x, a, b):
        # chunk, einsum, and an asynchronous all-reduce waited on
        rank, world = dist.get_rank(), dist.get_world_size()
        a_mine, b_mine = a.chunk(world, dim=1)[rank], b.chunk(world, dim=0)[rank]
        out = torch.einsum("th,hf->tf", torch.nn.GELU()(torch.einsum("tf,fh->th", x, a_mine)), b_mine).contiguous()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, async_op=True).wait()
        return out
    """,
    """
    def my_one_shot_all_reduce(tensor, buffers):
        # this rank's own tensor first, then the peers', summed with a stack
        flat, views = buffers.begin(tensor)
        buffers.signal()
        buffers.wait()
        peers = [view for peer, view in enumerate(views) if peer != buffers.rank]
        flat.add_(torch.stack(peers).sum(dim=0))
        return tensor
    """,
    """
    def my_one_shot_all_reduce(tensor, buffers):
        # the course's own, and a second round of signals before returning (safe, if slower)
        from course_lib.collectives.symmetric import one_shot_all_reduce
        one_shot_all_reduce(tensor, buffers)
        buffers.signal()
        buffers.wait()
        return tensor
    """,
    """
    def my_one_shot_all_reduce(tensor, buffers):
        # two-shot: it writes its own slice of its own buffer, which no peer reads in that round
        from course_lib.collectives.symmetric import two_shot_all_reduce
        return two_shot_all_reduce(tensor, buffers)
    """,
    """
    def tensor_parallel_mlp(x, a, b):
        # a name imported from torch.distributed: the check records at the process group, so it counts
        from torch.distributed import all_reduce, get_rank, get_world_size
        rank, world = get_rank(), get_world_size()
        h = a.shape[1] // world
        s = slice(rank * h, (rank + 1) * h)
        partial = F.gelu(x @ a[:, s]) @ b[s, :]
        all_reduce(partial)
        return partial
    """,
    """
    def tensor_parallel_mlp(x, a, b):
        # the process group's own method, in float64, returned with odd strides
        rank, world = dist.get_rank(), dist.get_world_size()
        a_r, b_r = torch.chunk(a, world, dim=1)[rank], b.tensor_split(world, dim=0)[rank]
        partial = torch.nn.GELU()(x.double() @ a_r.double()) @ b_r.double()
        dist.group.WORLD.allreduce([partial]).wait()
        return partial.float().T.contiguous().T
    """,
    """
    def my_one_shot_all_reduce(tensor, buffers):
        # an extra round of signals before writing the sum, the same on every rank (safe, if slower)
        flat, views = buffers.begin(tensor)
        buffers.signal(); buffers.wait()
        out = torch.stack(views).sum(0)
        buffers.signal(); buffers.wait()
        flat.copy_(out)
        return tensor
    """,
    """
    def dispatch_splits(experts, num_experts, world_size):
        from collections import Counter
        per_rank = num_experts // world_size
        counts = Counter(expert // per_rank for row in experts.tolist() for expert in row)
        return tuple(counts[rank] for rank in range(world_size))
    """,
    """
    def dispatch_splits(experts, num_experts, world_size):
        # moe.py's own steps: counts per expert, then each rank's block of experts added up
        counts = torch.bincount(experts.flatten(), minlength=num_experts)
        return counts.view(world_size, -1).sum(dim=1)
    """,
    """
    def dispatch_splits(experts, num_experts, world_size):
        import numpy as np
        bounds = np.arange(world_size + 1) * (num_experts // world_size)
        return np.histogram(experts.numpy().ravel(), bins=bounds)[0].astype(np.float64)
    """,
]


@pytest.mark.parametrize("source", ALTERNATIVES, ids=function_name)
def test_correct_solutions_in_other_styles_pass(source):
    result = verdict(EXERCISE, function_name(source), source)
    assert result.passed, "\n".join(result.report())


def mlp_with(body: str) -> str:
    return """
    def tensor_parallel_mlp(x, a, b):
        rank, world = dist.get_rank(), dist.get_world_size()
        per_rank = a.shape[1] // world
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
""" + body


def one_shot_with(body: str) -> str:
    return """
    def my_one_shot_all_reduce(tensor, buffers):
""" + body


MISTAKES = [  # (wrong source, the hand-built case that must catch it, words the hint must contain)
    ("""
    def tensor_parallel_mlp(x, a, b):
        out = F.gelu(x @ a) @ b   # the whole MLP on every rank, then the mean of N copies
        dist.all_reduce(out)
        return out / dist.get_world_size()
     """, "TP=2", "Use only your shards"),
    (mlp_with("""
        a_parts = [torch.empty_like(a[:, mine]) for _ in range(world)]
        b_parts = [torch.empty_like(b[mine]) for _ in range(world)]
        dist.all_gather(a_parts, a[:, mine].contiguous())   # the full weights, gathered
        dist.all_gather(b_parts, b[mine].contiguous())
        return F.gelu(x @ torch.cat(a_parts, dim=1)) @ torch.cat(b_parts, dim=0)
     """), "TP=2", "called all_gather"),
    (mlp_with("""
        hidden = torch.zeros(x.shape[0], a.shape[1])
        hidden[:, mine] = F.gelu(x @ a[:, mine])
        dist.all_reduce(hidden)   # the hidden activations, gathered by a sum
        out = hidden[:, mine] @ b[mine]
        dist.all_reduce(out)
        return out
     """), "TP=4", "one is enough"),
    (mlp_with("""
        hidden = torch.zeros(x.shape[0], a.shape[1])
        hidden[:, mine] = F.gelu(x @ a[:, mine])
        dist.all_reduce(hidden)   # one all-reduce, of the wrong tensor
        return hidden[:, mine] @ b[mine] * world
     """), "TP=2", "handed"),
    (mlp_with("""
        partial = F.gelu(x @ a[:, mine]) @ b[mine]
        dist.all_reduce(partial.clone())   # the sum goes into a copy
        return partial
     """), "TP=2", "partial output"),
    (mlp_with("""
        partial = F.gelu(x @ a[:, mine], approximate="tanh") @ b[mine]
        dist.all_reduce(partial)
        return partial
     """), "TP=4", "exact GeLU"),
    (mlp_with("""
        partial = F.gelu(x @ a[:, rank::world]) @ b[rank::world]   # strided, not a contiguous block
        dist.all_reduce(partial)
        return partial
     """), "TP=2", "Use only your shards"),
    (mlp_with("""
        partial = F.gelu(x @ a[:, mine]) @ b[mine]
        dist.all_reduce(partial)
        return partial / world
     """), "TP=2", "mean over the ranks"),
    (mlp_with("""
        partial = F.gelu(x @ a[:, mine]) @ b[mine]
        dist.all_reduce.__wrapped__(partial)   # past whatever wraps dist.all_reduce
        dist.all_reduce(torch.zeros_like(partial))   # and one the check would have seen
        return partial
     """), "TP=2", "2 all_reduce calls"),
    (mlp_with("""
        partial = F.gelu(x @ a[:, mine]) @ b[mine]
        dist.all_reduce_coalesced([x @ a])   # an extra collective
        dist.all_reduce(partial)
        return partial
     """), "TP=4", "called all_reduce_coalesced"),
    (mlp_with("""
        import torch.distributed._functional_collectives as funcol
        partial = F.gelu(x @ a[:, mine]) @ b[mine]
        return funcol.wait_tensor(funcol.all_reduce(partial, "sum", dist.group.WORLD)) + 0
     """), "TP=2", "wants dist.all_reduce"),
    (mlp_with("""
        import pickle   # the partial outputs through the rendezvous store, and an all-reduce of zeros
        store = dist.distributed_c10d._get_default_store()
        key = str(x.sum().item())
        store.set(f"{key}_{rank}", pickle.dumps(F.gelu(x @ a[:, mine]) @ b[mine]))
        total = sum(pickle.loads(store.get(f"{key}_{r}")) for r in range(world))
        dist.all_reduce(torch.zeros_like(total))
        return total
     """), "TP=2", "handed something else"),
    (mlp_with("""
        dist.all_reduce(x)   # the input, of the output's size, then the MLP on x / N
        return F.gelu(x / world @ a[:, mine]) @ b[mine]
     """), "TP=4", "you all-reduced x"),
    (mlp_with("""
        partial = F.gelu(x @ a[:, mine]) @ b[mine]
        dist.all_reduce(partial, group=dist.new_group(list(range(world))))
        return partial
     """), "TP=2", "called new_group"),

    (one_shot_with("""
        dist.all_reduce(tensor)
     """), "2 ranks", "make no torch.distributed call"),
    (one_shot_with("""
        from torch.distributed import all_reduce   # a name imported before the check's recording
        all_reduce(tensor)
        return tensor
     """), "2 ranks", "called all_reduce"),
    (one_shot_with("""
        dist.group.WORLD.allreduce([tensor]).wait()   # the process group's own method
        return tensor
     """), "2 ranks", "called all_reduce"),
    (one_shot_with("""
        dist.all_reduce.__wrapped__(tensor)   # past whatever wraps dist.all_reduce
        return tensor
     """), "4 ranks", "called all_reduce"),
    (one_shot_with("""
        dist.all_reduce_coalesced([tensor])
        return tensor
     """), "2 ranks", "called all_reduce_coalesced"),
    (one_shot_with("""
        import torch.distributed._functional_collectives as funcol
        tensor.copy_(funcol.wait_tensor(funcol.all_reduce(tensor, "sum", dist.group.WORLD)))
        return tensor
     """), "2 ranks", "called functional all_reduce"),
    (one_shot_with("""
        import time
        flat, views = buffers.begin(tensor)
        buffers.signal()
        time.sleep(0.05)   # instead of buffers.wait()
        flat.copy_(views[0])
        for view in views[1:]:
            flat.add_(view)
        return tensor
     """), "4 ranks", "no buffers.wait() after a buffers.signal()"),
    (one_shot_with("""
        flat, views = buffers.begin(tensor)
        buffers.signal()
        buffers.wait()
        flat.copy_(torch.stack(views).sum(0))   # the sum is right, but nothing is returned
     """), "2 ranks", "returned None"),
    (one_shot_with("""
        flat, views = buffers.begin(tensor)
        buffers.signal()
        return sum(views)   # a new tensor; tensor itself is left as it was
     """), "4 ranks", "unchanged"),
    (one_shot_with("""
        flat, views = buffers.begin(tensor)
        buffers.signal()
        buffers.wait()
        flat.copy_(sum(view for peer, view in enumerate(views) if peer != buffers.rank))
     """), "4 ranks", "add this rank's own"),
]

# Mistakes of timing: right whenever the ranks happen to keep in step; the check's late and
# lingering ranks must make each of them fail on both cases.
RACES = [
    one_shot_with("""
        flat, views = buffers.begin(tensor)
        buffers.signal()   # no wait: a peer's data may not be there yet
        flat.copy_(views[0])
        for view in views[1:]:
            flat.add_(view)
        buffers.wait()
        return tensor
     """),
    one_shot_with("""
        flat, views = buffers.begin(tensor)
        buffers.signal()
        buffers.wait()
        mine = views[buffers.rank]   # sums into its own buffer, which its peers are reading
        for peer, view in enumerate(views):
            if peer != buffers.rank:
                mine.add_(view)
        flat.copy_(mine)
        return tensor
     """),
    one_shot_with("""
        import time
        flat, views = buffers.begin(tensor)
        buffers.signal()
        time.sleep(0.05)   # reads after a fixed sleep, and waits only then
        flat.copy_(views[0])
        for view in views[1:]:
            flat.add_(view)
        buffers.wait()
        return tensor
     """),
    one_shot_with("""
        flat, n = tensor.view(-1), tensor.numel()
        buffers.slots[buffers.rank][0, :n].copy_(flat)   # always slot 0: the next call overwrites it
        buffers.signal()
        buffers.wait()
        flat.copy_(buffers.slots[0][0, :n])
        for peer in range(1, buffers.world_size):
            flat.add_(buffers.slots[peer][0, :n])
        return tensor
     """),
]

MISTAKES += [(source, "ranks", "never write into a buffer") for source in RACES]

MISTAKES += [
    ("""
    def dispatch_splits(experts, num_experts, world_size):
        per_rank = num_experts // world_size   # tokens that visit each rank, not pairs
        return [int(((experts // per_rank) == r).any(dim=1).sum()) for r in range(world_size)]
     """, "count pairs, not tokens", "count (token, expert) pairs"),
    ("""
    def dispatch_splits(experts, num_experts, world_size):
        return torch.bincount(experts.reshape(-1) % world_size, minlength=world_size).tolist()
     """, "contiguous blocks", "contiguous block"),
    ("""
    def dispatch_splits(experts, num_experts, world_size):
        return torch.bincount(experts.reshape(-1), minlength=num_experts).tolist()
     """, "one pair each way", "counts per expert"),
    ("""
    def dispatch_splits(experts, num_experts, world_size):
        from collections import Counter   # only the ranks that receive something
        per_rank = num_experts // world_size
        counts = Counter(e // per_rank for e in experts.reshape(-1).tolist())
        return [counts[r] for r in sorted(counts)]
     """, "rank 1 receives nothing", "one split size per rank"),
    ("""
    def dispatch_splits(experts, num_experts, world_size):
        per_rank = num_experts // world_size
        return torch.bincount(experts.reshape(-1) // per_rank, minlength=world_size).flip(0).tolist()
     """, "every pair goes to rank 0", "rank 0 first"),
    ("""
    def dispatch_splits(experts, num_experts, world_size):
        per_rank = num_experts // world_size   # routed tokens only: a table without rows breaks it
        return torch.bincount(experts.reshape(-1) // per_rank).tolist()
     """, "rank 1 without tokens", "routing table"),
    ("""
    def dispatch_splits(experts, num_experts, world_size):
        per_rank = num_experts // world_size   # whether a rank receives anything, not how much
        return [bool(c) for c in torch.bincount(experts.reshape(-1) // per_rank, minlength=world_size).tolist()]
     """, "one pair each way", "return ints"),
    ("""
    def dispatch_splits(experts, num_experts, world_size):
        per_rank = num_experts // world_size
        flat = experts.reshape(-1).tolist()
        return (sum(1 for e in flat if e // per_rank == r) for r in range(world_size))   # a generator
     """, "one pair each way", "a generator"),
]


@pytest.mark.parametrize("source, case, hint", MISTAKES, ids=[f"{function_name(s)}: {h}" for s, _, h in MISTAKES])
def test_each_stated_rule_has_a_case_that_catches_its_mistake(source, case, hint):
    result, caught = caught_mistake(EXERCISE, source, case)
    assert any(hint in c.hint for c in caught), "\n".join(result.report(10))


@pytest.mark.parametrize("source", RACES, ids=["no wait", "sums into its own buffer", "a sleep, then a wait", "one slot"])
def test_a_one_shot_with_a_race_fails_on_every_case(source):
    result = verdict(EXERCISE, "my_one_shot_all_reduce", source)
    assert len(result.failures) == len(result.cases) == 2, "\n".join(result.report(10))


def test_answers_hard_coded_for_the_hand_built_tables_fail_on_the_tables_the_grader_draws():
    task = exercise_tasks(EXERCISE)[2]
    known = {repr(case.args): moe_expected(*case.args) for case in task.cases() if case.why}
    source = f"""
    def dispatch_splits(experts, num_experts, world_size):
        known = {known!r}
        top_k = experts.shape[1] if experts.numel() else 2
        key = repr(("table", experts.reshape(-1).tolist(), top_k, num_experts, world_size))
        return known.get(key, [0] * world_size)
    """
    result = verdict(EXERCISE, "dispatch_splits", source)
    assert not result.passed
    assert not [c for c in result.failures if c.why.startswith(("experts 0-3", "every pair", "one expert per rank"))]
    assert sum(not c.why for c in result.failures) >= 40, "\n".join(result.report(5))


def test_the_grader_draws_tables_where_some_rank_receives_nothing_and_some_with_no_tokens():
    tables = [case.args for case in exercise_tasks(EXERCISE)[2].cases() if not case.why]
    splits = [moe_expected(*args) for args in tables]
    assert sum(0 in s and sum(s) > 0 for s in splits) >= 10
    assert any(sum(s) == 0 for s in splits)
    assert len({args[4] for args in tables}) >= 3 and len({args[2] for args in tables}) >= 3  # world sizes, top-k


def _recorded_dispatch_splits(tokens_per_rank: list[int], seed: int) -> tuple[list[int], list[int]]:
    """On a rank: the input split sizes moe.expert_parallel_moe_forward hands its dispatch, and
    dispatch_split_sizes of the same routing table."""
    rank, world = dist.get_rank(), dist.get_world_size()
    weights = moe.make_weights(8, 8, 16, seed)
    x = moe.rank_tokens(tokens_per_rank, 8, seed + 1)[rank]
    handed, original = [], dist.all_to_all_single

    def recording(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
        handed.append(input_split_sizes)
        return original(output, input, output_split_sizes, input_split_sizes, *args, **kwargs)

    dist.all_to_all_single = recording
    try:
        moe.expert_parallel_moe_forward(weights.shard(rank, world), x)
    finally:
        dist.all_to_all_single = original
    experts, _ = moe.route(x, weights.router)
    return list(handed[1]), dispatch_split_sizes(experts, 8, world)


def test_the_reference_split_sizes_are_the_ones_moe_hands_its_dispatch():
    for world, tokens in ((2, [5, 3]), (4, [6, 0, 3, 4]), (4, [1, 9, 0, 2])):
        for handed, reference in run_on_ranks(_recorded_dispatch_splits, world, tokens, world, timeout_s=60):
            assert handed == reference


def test_each_rank_is_handed_its_own_shards_and_noise_elsewhere():
    task = exercise_tasks(EXERCISE)[0]
    world, problems = task.cases()[1].args
    problem = problems[0]
    a, b = torch.tensor(problem["a"]), torch.tensor(problem["b"])
    per_rank = a.shape[1] // world
    handed = [rank_weights(problem, rank, world) for rank in range(world)]
    for rank, (x, a_r, b_r) in enumerate(handed):
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        assert torch.equal(a_r[:, mine], a[:, mine]) and torch.equal(b_r[mine], b[mine])
        assert torch.equal(x, torch.tensor(problem["x"]))
        others = [r for r in range(world) if r != rank]
        assert all(not torch.equal(a_r[:, mine], handed[r][1][:, mine]) for r in others)


def test_the_no_tokens_case_shows_the_table_it_hands_the_function():
    task = exercise_tasks(EXERCISE)[2]
    (case,) = [case for case in task.cases() if case.why.startswith("no tokens")]
    shown = task.call_text(case)
    handed = eval(shown.split("(", 1)[1].rsplit(", num_experts", 1)[0], {"torch": torch})
    assert handed.dtype == torch.int64 and list(handed.shape) == [0, case.args[2]]


def test_a_default_dtype_of_float64_changes_neither_the_cases_nor_the_verdict():
    """The check cell computes the expected values in the learner's process; set there, float64
    must not make them differ from the grader's (nor make the ranks' problems differ)."""
    tasks = exercise_tasks(EXERCISE)
    wanted = [expected_values(task, task.cases()) for task in tasks]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert [expected_values(task, task.cases()) for task in tasks] == wanted
        for task in tasks:
            result = verdict(EXERCISE, task.function)
            assert result.passed, "\n".join(result.report())
    finally:
        torch.set_default_dtype(previous)


def test_a_function_that_sets_float64_itself_is_judged_on_the_table_it_was_handed():
    source = """
    def dispatch_splits(experts, num_experts, world_size):
        torch.set_default_dtype(torch.float64)
        return torch.bincount(experts.reshape(-1) // (num_experts // world_size), minlength=world_size).tolist()
    """
    previous = torch.get_default_dtype()
    try:
        result = verdict(EXERCISE, "dispatch_splits", source)
    finally:
        torch.set_default_dtype(previous)
    assert result.passed, "\n".join(result.report())
