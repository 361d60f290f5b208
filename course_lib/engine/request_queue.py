"""The scheduler's waiting queue, one class per ``scheduling_policy`` (vLLM's request queues).

Both offer ``add`` (a new request), ``prepend`` (a preempted one, to be resumed first), ``peek``
and ``pop`` (the next to admit), ``len``, truth and iteration in admission order.
  * ``FCFSQueue`` (policies "fcfs"/"continuous" and "static"): arrival order; a preempted request
    goes back to the front;
  * ``PriorityQueue`` ("priority"): lowest ``(priority, arrival_time)`` first, so a lower
    priority value is served first and ties go to the earlier arrival. A preempted request keeps
    its key, so it is simply re-added: it resumes ahead of everything it outranks.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Iterator

from course_lib.engine.request import Request


class FCFSQueue:
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def prepend(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._order = itertools.count()  # breaks exact ties by insertion, never compares requests

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, next(self._order), request))

    prepend = add  # a preempted request's key already places it

    def peek(self) -> Request:
        return self._heap[0][-1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def remove(self, request: Request) -> None:
        self._heap = [entry for entry in self._heap if entry[-1] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in sorted(self._heap))


def waiting_queue(policy: str) -> FCFSQueue | PriorityQueue:
    return PriorityQueue() if policy == "priority" else FCFSQueue()
