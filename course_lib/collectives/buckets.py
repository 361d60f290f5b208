"""Which gradients DDP all-reduces together: its bucket assignment, over parameter sizes alone.

DistributedDataParallel (torch 2.13) does not all-reduce each gradient on its own: it packs them
into buckets of about ``bucket_cap_mb`` and all-reduces one flat buffer per bucket, launched as
soon as the bucket's last gradient is ready, while backward goes on computing earlier layers.
The rules, read in ``torch/nn/parallel/distributed.py`` and the C++ ``Reducer`` and checked on
real ranks (``tests/collectives/test_buckets.py``, ``test_ddp_timeline.py``):

1. Caps. ``bucket_cap_mb`` is MiB: ``int(mb * 1024 * 1024)`` bytes, 25 MiB when not given. The
   first bucket to fire has its own cap, ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB), but only
   when ``bucket_cap_mb`` is left at its default; an explicit ``bucket_cap_mb`` caps the first
   bucket too (``_BucketCapacityConfig.create``). ``ddp_caps`` returns the pair.
2. Walk. Parameters are taken in the order their gradients become ready in backward; for a
   model run front to back that is the reverse of ``model.parameters()`` (a ``Linear``'s bias
   before its weight), so bucket 0 holds the last layers and fires first.
3. Closing. A parameter is added to the open bucket, then the bucket closes if its bytes are
   ``>=`` the cap (``compute_bucket_assignment_by_size``). So a bucket may overshoot the cap by
   its last parameter; a parameter larger than the cap closes the bucket it joins (a bucket of
   its own only when that bucket was empty); what is left open at the end is the last bucket.
   Only the first bucket closed uses the first cap.
4. Types. Each (dtype, device) pair has its own open bucket and its own first cap; this module
   assumes one dtype on one device, as in a plain fp32 or bf16 model.
5. When. The first iteration is different: DDP starts with ONE bucket holding every parameter
   (limit ``sys.maxsize``, ``compute_bucket_size_limits``), records the order gradients become
   ready, and rebuilds the buckets by rules 1-4 at the next forward (``_rebuild_buckets``); with
   ``static_graph=True`` one iteration later. With ``find_unused_parameters=True`` it never
   rebuilds: its buckets are cut once, walking ``model.parameters()`` front to back (the small
   first cap then lands on the FIRST layers), and reversed.
6. Order. Bucket ``i`` is launched only after buckets ``0..i-1`` (every rank must issue the
   same all-reduces in the same order); in a communication hook ``bucket.index()`` is this
   position, ``bucket.parameters()`` its parameters in ready order and ``bucket.buffer()`` the
   flat gradients, laid out in that order.
"""

from __future__ import annotations

from course_lib.perf.units import MiB

MIB = MiB  # the name the reducer, its grading checks and the bucket tests import
DEFAULT_BUCKET_CAP_MB = 25  # DDP's default bucket_cap_mb
DEFAULT_FIRST_BUCKET_BYTES = MiB  # dist._DEFAULT_FIRST_BUCKET_BYTES


def ddp_caps(bucket_cap_mb: float | None = None) -> tuple[int, int]:
    """``(bucket_cap_bytes, first_bucket_cap_bytes)`` as DDP derives them from ``bucket_cap_mb``."""
    if bucket_cap_mb is None:
        return DEFAULT_BUCKET_CAP_MB * MiB, DEFAULT_FIRST_BUCKET_BYTES
    if bucket_cap_mb <= 0:
        raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}.")
    cap = int(bucket_cap_mb * MiB)
    return cap, cap


def assign_buckets(param_bytes: list[int], bucket_cap_bytes: int,
                   first_bucket_cap_bytes: int | None = None) -> list[list[int]]:
    """DDP's rebuilt buckets (rules 1-4 above) as lists of indices into ``model.parameters()``.

    ``param_bytes[i]`` is parameter ``i``'s size in bytes (one dtype). Bucket 0 fires first and
    holds the last parameters; inside a bucket indices are in ready order (descending), so the
    concatenated buckets are ``n-1, ..., 1, 0``. ``first_bucket_cap_bytes=None`` means the
    same cap as the others (what DDP does when ``bucket_cap_mb`` is given).
    """
    if bucket_cap_bytes <= 0 or (first_bucket_cap_bytes is not None and first_bucket_cap_bytes <= 0):
        raise ValueError("bucket caps must be positive byte counts.")
    if any(size < 0 for size in param_bytes):
        raise ValueError("parameter sizes must be non-negative byte counts.")
    cap = bucket_cap_bytes if first_bucket_cap_bytes is None else first_bucket_cap_bytes
    buckets: list[list[int]] = []
    open_bucket: list[int] = []
    open_bytes = 0
    for index in reversed(range(len(param_bytes))):
        open_bucket.append(index)
        open_bytes += param_bytes[index]
        if open_bytes >= cap:
            buckets.append(open_bucket)
            open_bucket, open_bytes, cap = [], 0, bucket_cap_bytes
    if open_bucket:
        buckets.append(open_bucket)
    return buckets
