"""An approach an exercise's text suggests passes, and a torch.distributed backend's error is told in
the learner's words (``task.ERROR_HINTS``).

Exercise 07's text suggests ``tensor.tensor_split(L)`` for the shards of the hierarchical all-reduce.
Its pieces differ by one element, and gloo (the backend every check runs on) refuses an all-gather of
pieces of different sizes with ``invalid tensor size``; the text says how to gather them, and the
feedback explains that message.
"""

from __future__ import annotations

import nbformat

from course_lib.exercise_files import course_exercise, solution_file
from course_lib.grading import task
from course_lib.paths import REPO_ROOT
from test_checks import verdict

EXERCISE = "07_nccl_topology"
FUNCTION = "my_hierarchical_all_reduce"

SPLIT = """
def my_hierarchical_all_reduce(tensor, ranks_per_node):
    world, L = dist.get_world_size(), ranks_per_node
    node, local = divmod(dist.get_rank(), L)
    in_node = [dist.new_group(list(range(m * L, (m + 1) * L))) for m in range(world // L)]
    across = [dist.new_group(list(range(i, world, L))) for i in range(L)]
    pieces = tensor.tensor_split(L)
    shard = torch.empty_like(pieces[local])
    dist.reduce_scatter(shard, [piece.clone() for piece in pieces], group=in_node[node])
    dist.all_reduce(shard, group=across[local])
"""

# step 3 as the text says: each piece padded to ceil(n / L) elements for the all-gather
SUGGESTED = SPLIT + """
    size = math.ceil(tensor.numel() / L)
    gathered = [torch.zeros(size) for _ in range(L)]
    dist.all_gather(gathered, torch.cat([shard, shard.new_zeros(size - shard.numel())]), group=in_node[node])
    for piece, got in zip(pieces, gathered):
        piece.copy_(got[:piece.numel()])
"""

UNEVEN_ALL_GATHER = SPLIT + """
    dist.all_gather(list(pieces), shard, group=in_node[node])
"""

WORLD_SIZED_LIST = SPLIT + """
    gathered = [torch.zeros_like(shard) for _ in range(world)]  # one per rank of the world, not of the node
    dist.all_gather(gathered, shard, group=in_node[node])
"""

UNPADDED_REDUCE_SCATTER = """
def my_hierarchical_all_reduce(tensor, ranks_per_node):
    world, L = dist.get_world_size(), ranks_per_node
    node, local = divmod(dist.get_rank(), L)
    in_node = [dist.new_group(list(range(m * L, (m + 1) * L))) for m in range(world // L)]
    across = [dist.new_group(list(range(i, world, L))) for i in range(L)]
    shard = torch.empty(math.ceil(tensor.numel() / L))
    dist.reduce_scatter_tensor(shard, tensor.clone(), group=in_node[node])  # the tensor itself, not padded
    dist.all_reduce(shard, group=across[local])
    gathered = torch.empty(shard.numel() * L)
    dist.all_gather_into_tensor(gathered, shard, group=in_node[node])
    tensor.copy_(gathered[:tensor.numel()])
"""


def _task_text(path) -> str:
    book = nbformat.read(path, as_version=4)
    return next(cell.source for cell in book.cells if cell.cell_type == "markdown" and f"`{FUNCTION}(" in cell.source)


def test_the_text_that_suggests_tensor_split_says_how_to_gather_its_pieces():
    for path in (course_exercise(EXERCISE), REPO_ROOT / "solutions" / solution_file(EXERCISE)):
        text = _task_text(path)
        assert "tensor_split" in text
        assert "same size" in text and "pad" in text.split("All-gather inside the node", 1)[1], text


def test_the_suggested_tensor_split_approach_passes():
    result = verdict(EXERCISE, FUNCTION, SUGGESTED)
    assert result.passed, "\n".join(result.report())


def _hints(source: str) -> set[str]:
    result = verdict(EXERCISE, FUNCTION, source)
    assert not result.passed
    return {case.hint for case in result.failures}


def test_an_all_gather_of_uneven_pieces_is_told_why_in_the_learners_words():
    hints = _hints(UNEVEN_ALL_GATHER)
    assert any("all_gather needs every rank's piece to be the same size" in hint and "pad" in hint for hint in hints), hints


def test_an_all_gather_list_of_the_wrong_length_is_told_why():
    hints = _hints(WORLD_SIZED_LIST)
    assert any("one tensor per rank of the group" in hint for hint in hints), hints


def test_a_reduce_scatter_of_an_unpadded_tensor_is_told_why():
    hints = _hints(UNPADDED_REDUCE_SCATTER)
    assert any("group's size times" in hint and "pad" in hint for hint in hints), hints


def test_error_hints_match_backend_messages_only():
    error_hint = task.error_hint
    assert "same size" in error_hint("RankFailure: rank 1 raised RuntimeError: ProcessGroupGloo::allgather: invalid "
                                     "tensor size at index 0 (expected (3), got (2))")
    assert "not done yet" in error_hint("NotImplementedError: Your code here: replace this line (see the task above).")
    assert error_hint("ValueError: invalid tensor size, says my own code") == ""
    assert error_hint("ZeroDivisionError: division by zero") == ""
