"""Where one launch's ranks meet to form their process group: a ``FileStore``, then a barrier.

The ranks exchange their addresses through a ``torch.distributed.FileStore`` (a file they all open),
not a ``TCPStore``, for two reasons measured on this course's machines:

- A ``TCPStore`` client formats the server's address with ``getnameinfo``, which asks DNS for the
  name of ``::ffff:127.0.0.1`` (``/etc/hosts`` names only ``127.0.0.1``); where DNS drops a query,
  that call waits out the resolver's 5 s timeout. Every rank, rank 0 included, is such a client, so
  8-rank launches stalled by 5 s in 30 of 180 tries here, 4-rank ones in 5 of 180. A file needs
  no lookup.
- The store's server lived in rank 0, so a rank 0 that finished early and exited took the store
  away from ranks still reading their peers' addresses. A file outlives every rank.

``meet`` ends with a barrier on the store: no rank returns until every rank has built its process
group. Without it a rank that had joined could run a short function and exit while a peer was
still completing its half of gloo's full-mesh handshake with it ("Gloo connectFullMesh failed ...
Connection closed by peer").

On Linux the launcher unlinks the file at once and the ranks, which inherit its descriptor by
``fork``, open it as ``/proc/self/fd/N``: nothing is left on disk however the launching process
ends. Elsewhere the file has a name until ``StoreFile.close``.
"""

from __future__ import annotations

import datetime
import os
import tempfile

import torch.distributed as dist

JOINED_KEY = "course_lib/every-rank-joined"  # the barrier's key in the launch's own store


class StoreFile:
    """The file of one launch's ``FileStore``, made empty and private to this launch.

    ``path`` is how the ranks open it. ``inherited`` says the ranks start by ``fork``, so they
    inherit the open descriptor and the file can be unlinked now (Linux, where ``/proc`` exists)."""

    def __init__(self, prefix: str, inherited: bool) -> None:
        self.fd, self.name = tempfile.mkstemp(prefix=prefix)
        if inherited and os.path.isdir(f"/proc/{os.getpid()}/fd"):
            os.unlink(self.name)
            self.name, self.path = None, f"/proc/self/fd/{self.fd}"
        else:
            self.path = self.name

    def close(self) -> None:
        """Close the file, and remove it if it still has a name (idempotent)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.name is not None:
            try:
                os.unlink(self.name)
            except FileNotFoundError:
                pass
            self.name = None


def meet(rank: int, world_size: int, backend: str, store_path: str, timeout: datetime.timedelta) -> None:
    """Join this rank's process group through the store at ``store_path``; return once every rank has
    joined. ``backend`` goes to ``init_process_group`` as it is."""
    store = dist.FileStore(store_path, world_size)
    store.set_timeout(timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    store.barrier(JOINED_KEY, world_size, timeout)
