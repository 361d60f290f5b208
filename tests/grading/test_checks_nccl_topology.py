"""Exercise 07's tasks against solutions in other styles (they must pass) and against the mistake
each stated rule is there to catch (each must fail on the case built for that rule, with its hint).
Tasks 2 and 4 run on real ranks and are judged also by the calls the function made."""

import pytest

from test_checks import caught_mistake, function_name, verdict

EXERCISE = "07_nccl_topology"

ALTERNATIVES = [
    """
    def bandwidths(collective, num_bytes, seconds, num_ranks):
        from fractions import Fraction
        import numpy as np
        n = Fraction(num_ranks)
        crossings = {"all_reduce": 2 * (n - 1) / n, "broadcast": 1, "reduce": 1}.get(collective, (n - 1) / n)
        algbw = np.float64(num_bytes) / seconds / 10**9
        return [algbw, algbw * float(crossings)]
    """,
    """
    def my_hierarchical_all_reduce(tensor, ranks_per_node):
        # pieces of unequal size (tensor_split), a reduce-scatter of a list, and broadcasts inside the node
        world, per_node = dist.get_world_size(), ranks_per_node
        node, local_rank = divmod(dist.get_rank(), per_node)
        groups = {("node", m): dist.new_group(list(range(m * per_node, (m + 1) * per_node)))
                  for m in range(world // per_node)}
        groups.update({("across", i): dist.new_group(list(range(i, world, per_node))) for i in range(per_node)})
        pieces = tensor.tensor_split(per_node)
        mine = torch.empty_like(pieces[local_rank])
        dist.reduce_scatter(mine, [piece.clone() for piece in pieces], group=groups["node", node])
        dist.all_reduce(mine, group=groups["across", local_rank])
        pieces[local_rank].copy_(mine)
        for i, piece in enumerate(pieces):
            dist.broadcast(piece, src=node * per_node + i, group=groups["node", node])
    """,
    """
    def my_hierarchical_all_reduce(tensor, ranks_per_node):
        # the course's own: the shards cross nodes in a hand-written ring of isend and recv
        from course_lib.collectives.hierarchical import hierarchical_all_reduce, node_groups
        hierarchical_all_reduce(tensor, node_groups(ranks_per_node))
    """,
    """
    def my_hierarchical_all_reduce(tensor, ranks_per_node):
        # padded shards; across nodes, a ring of batch_isend_irecv over the ranks with this local rank
        rank, world, per_node = dist.get_rank(), dist.get_world_size(), ranks_per_node
        num_nodes, (node, local_rank) = world // per_node, divmod(rank, per_node)
        in_node = [dist.new_group(list(range(m * per_node, (m + 1) * per_node))) for m in range(num_nodes)]
        shard_numel = -(-tensor.numel() // per_node)
        padded = torch.cat([tensor, tensor.new_zeros(shard_numel * per_node - tensor.numel())])
        shard = tensor.new_empty(shard_numel)
        dist.reduce_scatter_tensor(shard, padded, group=in_node[node])
        chunks = shard.tensor_split(num_nodes)
        right, left = (rank + per_node) % world, (rank - per_node) % world
        for step in range(2 * (num_nodes - 1)):
            scatter = step < num_nodes - 1
            s = step if scatter else step - (num_nodes - 1)
            send = (node - s) % num_nodes if scatter else (node + 1 - s) % num_nodes
            receive = (node - s - 1) % num_nodes if scatter else (node - s) % num_nodes
            buffer = torch.empty_like(chunks[receive])
            for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[send], right),
                                                   dist.P2POp(dist.irecv, buffer, left)]):
                request.wait()
            chunks[receive].add_(buffer) if scatter else chunks[receive].copy_(buffer)
        dist.all_gather_into_tensor(padded, shard, group=in_node[node])
        tensor.copy_(padded[:tensor.numel()])
    """,
    """
    def my_assign_buckets(param_bytes, bucket_cap_bytes, first_bucket_cap_bytes):
        buckets = [[]]
        held = 0
        for index in range(len(param_bytes) - 1, -1, -1):
            buckets[-1].append(index)
            held += param_bytes[index]
            if held >= (first_bucket_cap_bytes if len(buckets) == 1 else bucket_cap_bytes):
                buckets.append([])
                held = 0
        return tuple(tuple(bucket) for bucket in buckets if bucket)
    """,
    """
    def install_bucketed_reducer(model, buckets):
        # get_future().then(...) averages and copies back; finish() waits on the chained futures
        params, futures = list(model.parameters()), []
        missing = [len(bucket) for bucket in buckets]
        bucket_of = {i: b for b, bucket in enumerate(buckets) for i in bucket}

        def copy_back(future, bucket):
            flat = future.value()[0] / dist.get_world_size()
            for i, piece in zip(bucket, flat.split([params[i].numel() for i in bucket])):
                params[i].grad.copy_(piece.view_as(params[i]))

        def ready(i):
            b = bucket_of[i]
            missing[b] -= 1
            if missing[b] == 0:
                flat = torch.cat([params[j].grad.reshape(-1) for j in buckets[b]])
                future = dist.all_reduce(flat, async_op=True).get_future()
                futures.append(future.then(lambda f, bucket=buckets[b]: copy_back(f, bucket)))

        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda _, i=i: ready(i))
        return lambda: torch.futures.wait_all(futures)
    """,
    """
    def install_bucketed_reducer(model, buckets):
        # futures instead of handles, and fresh .grad tensors instead of copies
        params = list(model.parameters())
        futures = []

        def hook(bucket):
            def on_ready(_):
                if all(params[i].grad is not None for i in bucket) and not any(b is bucket for b, _ in futures):
                    flat = torch.cat([params[i].grad.flatten() for i in bucket])
                    futures.append((bucket, dist.all_reduce(flat, async_op=True).get_future()))
            return on_ready

        for bucket in buckets:
            for i in bucket:
                params[i].register_post_accumulate_grad_hook(hook(bucket))

        def finish():
            torch.futures.wait_all([future for _, future in futures])
            for bucket, future in futures:
                flat = future.value()[0] / dist.get_world_size()
                for i, piece in zip(bucket, flat.split([params[i].numel() for i in bucket])):
                    params[i].grad = piece.view_as(params[i]).clone()
        return finish
    """,
]


@pytest.mark.parametrize("source", ALTERNATIVES, ids=function_name)
def test_correct_solutions_in_other_styles_pass(source):
    result = verdict(EXERCISE, function_name(source), source)
    assert result.passed, "\n".join(result.report())


FACTORS = """
        n = num_ranks
        factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
                  "all_to_all": (n - 1) / n, "broadcast": 1, "reduce": 1}[collective]
"""


def bandwidths_with(body: str, factors: str = FACTORS) -> str:
    return "def bandwidths(collective, num_bytes, seconds, num_ranks):" + factors + body


def buckets_with(order="reversed(range(len(param_bytes)))", closes=">=", next_cap="bucket_cap_bytes",
                 end="if bucket:\n            buckets.append(bucket)") -> str:
    return f"""
    def my_assign_buckets(param_bytes, bucket_cap_bytes, first_bucket_cap_bytes):
        buckets, bucket, held, cap = [], [], 0, first_bucket_cap_bytes
        for index in {order}:
            bucket.append(index)
            held += param_bytes[index]
            if held {closes} cap:
                buckets.append(bucket)
                bucket, held, cap = [], 0, {next_cap}
        {end}
        return buckets
    """


def reducer_with(launch: str, finish: str) -> str:
    """A reducer whose hooks call ``launch(b)`` when bucket b's last gradient is written."""
    return f"""
    def install_bucketed_reducer(model, buckets):
        parameters = list(model.parameters())
        missing = [len(bucket) for bucket in buckets]
        bucket_of = {{index: b for b, bucket in enumerate(buckets) for index in bucket}}
        launched = []

        def flat(b):
            return torch.cat([parameters[i].grad.reshape(-1) for i in buckets[b]])

        def copy_back(buffer, bucket):
            offset = 0
            for i in bucket:
                grad = parameters[i].grad
                grad.copy_(buffer[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()

        def ready(index):
            missing[bucket_of[index]] -= 1
            if missing[bucket_of[index]] == 0:
                {launch}

        for index, parameter in enumerate(parameters):
            parameter.register_post_accumulate_grad_hook(lambda _, index=index: ready(index))

        def finish():
            {finish}
        return finish
    """


ASYNC = "buffer = flat(bucket_of[index]); launched.append((dist.all_reduce(buffer, async_op=True), buffer, buckets[bucket_of[index]]))"

MISTAKES = [  # (wrong source, the hand-built case that must catch it, words the hint must contain)
    (bandwidths_with("        algbw = num_bytes / seconds / 1e9\n        return algbw, algbw / factor\n"),
     "busbw 175 GB/s", "upside down"),
    (bandwidths_with("        algbw = num_bytes / seconds / 1e9\n        return algbw, algbw * factor\n",
                     FACTORS.replace('"all_reduce": 2 * (n - 1) / n', '"all_reduce": (n - 1) / n')),
     "busbw 175 GB/s", "moves each byte twice"),
    (bandwidths_with("        algbw = num_bytes / seconds / 2**30\n        return algbw, algbw * factor\n"),
     "a GB is 10^9 bytes", "not 2^30"),
    (bandwidths_with("        algbw = num_bytes / seconds / 1e9\n        return algbw, algbw * num_ranks\n"),
     "busbw 175 GB/s", "the factor is not N"),
    (bandwidths_with("        algbw = num_bytes / seconds / 1e9\n        return algbw, algbw * factor\n",
                     FACTORS.replace('"broadcast": 1', '"broadcast": (n - 1) / n')),
     "broadcast: factor 1", "not (N-1)/N"),
    (bandwidths_with("        algbw = num_bytes / seconds / 1e9\n        return algbw, algbw * (factor if n > 1 else 1)\n"),
     "one rank: an all-reduce moves nothing", "= 0"),
    ("""
    def my_hierarchical_all_reduce(tensor, ranks_per_node):
        dist.all_reduce(tensor)
     """, "2 nodes of 2 ranks", "the world group spans every node"),
    ("""
    def my_hierarchical_all_reduce(tensor, ranks_per_node):
        world, rank, per_node = dist.get_world_size(), dist.get_rank(), ranks_per_node
        in_node = [dist.new_group(list(range(m * per_node, (m + 1) * per_node))) for m in range(world // per_node)]
        across = [dist.new_group(list(range(i, world, per_node))) for i in range(per_node)]
        dist.all_reduce(tensor, group=in_node[rank // per_node])
        dist.all_reduce(tensor, group=across[rank % per_node])   # the whole tensor across nodes
     """, "2 nodes of 3 ranks", "more than a shard"),
    ("""
    def my_hierarchical_all_reduce(tensor, ranks_per_node):
        # a flat ring over every rank: each send is small, but the boundary ranks send the tensor about twice
        rank, world = dist.get_rank(), dist.get_world_size()
        chunks = tensor.tensor_split(world)
        for step in range(2 * (world - 1)):
            scatter = step < world - 1
            s = step if scatter else step - (world - 1)
            send = (rank - s) % world if scatter else (rank + 1 - s) % world
            receive = (rank - s - 1) % world if scatter else (rank - s) % world
            buffer = torch.empty_like(chunks[receive])
            request = dist.isend(chunks[send], dst=(rank + 1) % world)
            dist.recv(buffer, src=(rank - 1) % world)
            request.wait()
            chunks[receive].add_(buffer) if scatter else chunks[receive].copy_(buffer)
     """, "3 nodes of 2 ranks", "a ring over every rank"),
    ("""
    def my_hierarchical_all_reduce(tensor, ranks_per_node):
        world, rank, per_node = dist.get_world_size(), dist.get_rank(), ranks_per_node
        in_node = [dist.new_group(list(range(m * per_node, (m + 1) * per_node))) for m in range(world // per_node)]
        across = [dist.new_group(list(range(i, world, per_node))) for i in range(per_node)]
        result = tensor.clone()
        dist.all_reduce(result, group=in_node[rank // per_node])
        dist.all_reduce(result, group=across[rank % per_node])
        return result
     """, "2 nodes of 2 ranks", "unchanged"),
    (bandwidths_with("        algbw = num_bytes / seconds / 1e9\n        return algbw * factor, algbw\n"),
     "busbw 175 GB/s", "swapped"),
    (buckets_with(closes="+ 1 >="), "one byte short of the cap stays open", "one byte short of it"),
    (buckets_with(order="range(len(param_bytes))"), "reverse order", "walk from the last parameter"),
    (buckets_with(closes=">"), "reach the cap exactly", ">=, not >"),
    ("""
    def my_assign_buckets(param_bytes, bucket_cap_bytes, first_bucket_cap_bytes):
        buckets, bucket, held, cap = [], [], 0, first_bucket_cap_bytes
        for index in reversed(range(len(param_bytes))):
            if bucket and held + param_bytes[index] > cap:   # closes before the cap is passed
                buckets.append(bucket)
                bucket, held, cap = [], 0, bucket_cap_bytes
            bucket.append(index)
            held += param_bytes[index]
        return buckets + [bucket] if bucket else buckets
     """, "larger than the cap closes the bucket it joins", "may overshoot"),
    (buckets_with(next_cap="first_bucket_cap_bytes"), "only bucket 0 has the first bucket's cap", "only bucket 0"),
    (buckets_with().replace("cap = [], [], 0, first_bucket_cap_bytes", "cap = [], [], 0, bucket_cap_bytes"),
     "DDP's defaults", "bucket 0 closes at first_bucket_cap_bytes"),
    (buckets_with(end="buckets.append(bucket)"), "no empty bucket after it", "no empty bucket"),
    (buckets_with().replace("return buckets", "return [sorted(bucket) for bucket in buckets]"),
     "reverse order", "descending"),
    (reducer_with(ASYNC, """for work, buffer, bucket in launched:
                work.wait()
                copy_back(buffer, bucket)"""), "3 buckets", "divide by the number of ranks"),
    (reducer_with("pass", """for b, bucket in enumerate(buckets):   # every bucket after backward
                buffer = flat(b)
                dist.all_reduce(buffer, async_op=True).wait()
                copy_back(buffer / dist.get_world_size(), bucket)"""), "3 buckets", "after the last gradient"),
    ("""
    def install_bucketed_reducer(model, buckets):
        parameters, written, launched = list(model.parameters()), set(), []

        def ready(index):   # every bucket at once, in the hook of the last gradient
            written.add(index)
            if len(written) == len(parameters):
                for bucket in buckets:
                    buffer = torch.cat([parameters[i].grad.reshape(-1) for i in bucket])
                    launched.append((dist.all_reduce(buffer, async_op=True), buffer, bucket))

        for index, parameter in enumerate(parameters):
            parameter.register_post_accumulate_grad_hook(lambda _, index=index: ready(index))

        def finish():
            for work, buffer, bucket in launched:
                work.wait()
                buffer /= dist.get_world_size()
                for i, piece in zip(bucket, buffer.split([parameters[i].numel() for i in bucket])):
                    parameters[i].grad.copy_(piece.view_as(parameters[i]))
        return finish
     """, "3 buckets", "after the last gradient"),
    (reducer_with(ASYNC + "; launched[-1][0].wait()", """for work, buffer, bucket in launched:   # waits in the hook too
                work.wait()
                copy_back(buffer / dist.get_world_size(), bucket)"""), "3 buckets", "inside backward (in a hook)"),
    (reducer_with("buffer = flat(bucket_of[index]); dist.all_reduce(buffer, async_op=True).wait(); "
                  "copy_back(buffer / dist.get_world_size(), buckets[bucket_of[index]])",
                  "pass   # everything was done in the hooks"), "3 buckets", "wait in finish()"),
    (reducer_with("buffer = flat(bucket_of[index]); launched.append((dist.all_reduce(buffer, async_op=True).get_future(), buffer, buckets[bucket_of[index]]))",
                  """for future, buffer, bucket in launched:   # asks whether it is done, never waits
                future.done()
                copy_back(buffer / dist.get_world_size(), bucket)"""), "3 buckets", "must wait on every handle"),
    (reducer_with(ASYNC, """for work, buffer, bucket in launched:   # never waits
                copy_back(buffer / dist.get_world_size(), bucket)"""), "3 buckets", "must wait on every handle"),
    (reducer_with("buffer = flat(bucket_of[index]); dist.all_reduce(buffer); copy_back(buffer / dist.get_world_size(), buckets[bucket_of[index]])",
                  "pass"), "3 buckets", "async_op=True"),
    ("""
    def install_bucketed_reducer(model, buckets):
        works = []   # one all-reduce per gradient, not per bucket
        for parameter in model.parameters():
            parameter.register_post_accumulate_grad_hook(
                lambda p: works.append((dist.all_reduce(p.grad, async_op=True), p)))

        def finish():
            for work, parameter in works:
                work.wait()
                parameter.grad /= dist.get_world_size()
        return finish
     """, "3 buckets", "one all_reduce per bucket"),
]


@pytest.mark.parametrize("source, case, hint", MISTAKES, ids=[f"{function_name(s)}: {h}" for s, _, h in MISTAKES])
def test_each_stated_rule_has_a_case_that_catches_its_mistake(source, case, hint):
    result, caught = caught_mistake(EXERCISE, source, case)
    assert any(hint in c.hint for c in caught), "\n".join(result.report(10))


def test_a_reducer_that_returns_no_finish_is_told_so():
    result = verdict(EXERCISE, "install_bucketed_reducer", """
        def install_bucketed_reducer(model, buckets):
            for parameter in model.parameters():
                parameter.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad, async_op=True))
    """)
    assert not result.passed
    assert all("returned NoneType, not a function: return finish" in c.got for c in result.failures)


def test_an_error_raised_on_a_rank_shows_its_own_line_however_long_its_traceback():
    result = verdict(EXERCISE, "my_hierarchical_all_reduce", """
        def my_hierarchical_all_reduce(tensor, ranks_per_node, depth=40):
            if depth:   # a traceback far longer than the error text a case may show
                return my_hierarchical_all_reduce(tensor, ranks_per_node, depth - 1)
            raise ValueError("the shard of rank-specific padding went missing")
    """)
    assert not result.passed
    for case in result.failures:
        assert "ValueError: the shard of rank-specific padding went missing" in case.got.split("\n")[0], case.got
        assert "characters left out" in case.got and "in my_hierarchical_all_reduce" in case.got


def test_a_reducer_that_launches_from_tensor_hooks_is_told_to_use_post_accumulate_hooks():
    result = verdict(EXERCISE, "install_bucketed_reducer", """
        def install_bucketed_reducer(model, buckets):
            params = list(model.parameters())   # register_hook: runs before the gradient is in .grad
            missing = [len(bucket) for bucket in buckets]
            bucket_of = {i: b for b, bucket in enumerate(buckets) for i in bucket}
            grads, works = {}, []

            def hook(i, grad):
                grads[i] = grad
                b = bucket_of[i]
                missing[b] -= 1
                if missing[b] == 0:
                    flat = torch.cat([grads[j].reshape(-1) for j in buckets[b]])
                    works.append((dist.all_reduce(flat, async_op=True), flat, buckets[b]))
                return grad

            for i, p in enumerate(params):
                p.register_hook(lambda grad, i=i: hook(i, grad))

            def finish():
                for work, flat, bucket in works:
                    work.wait()
                    flat /= dist.get_world_size()
                    for i, piece in zip(bucket, flat.split([params[j].numel() for j in bucket])):
                        params[i].grad.copy_(piece.view_as(params[i]))
            return finish
    """)
    assert not result.passed
    assert any("use register_post_accumulate_grad_hook (rule 1)" in c.hint for c in result.failures), \
        "\n".join(result.report(10))


def test_a_reducer_that_assumes_backward_order_is_reversed_parameters_order_fails():
    source = reducer_with(ASYNC, """for work, buffer, bucket in launched:
                work.wait()
                copy_back(buffer / dist.get_world_size(), bucket)""")
    source = source.replace("missing[bucket_of[index]] -= 1\n            if missing[bucket_of[index]] == 0:",
                            "if index == min(buckets[bucket_of[index]]):   # the lowest index comes last... usually")
    assert "usually" in source
    result = verdict(EXERCISE, "install_bucketed_reducer", source)
    assert not result.passed
    assert [c.why for c in result.failures] == [next(c.why for c in result.failures if "missing gradients" in c.why)]


def test_with_one_rank_per_node_the_world_group_is_the_cross_node_group():
    result = verdict(EXERCISE, "my_hierarchical_all_reduce", """
        def my_hierarchical_all_reduce(tensor, ranks_per_node):
            dist.all_reduce(tensor)
    """)
    assert not result.passed
    assert not [c for c in result.failures if "one rank per node" in c.why or "one node" in c.why]
