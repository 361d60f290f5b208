"""Prefix-cache keys: each full block's hash chains its parent's hash, its tokens and extra keys.

Because the parent's hash is inside, one hash names the whole prefix up to the end of its
block: two requests share a block's KV only if every token before it matches too.
Extra keys (the tenant's ``cache_salt``) go into the first block only, so different salts
never share any block. sha256 over a canonical encoding keeps collisions out of reach.
"""

from __future__ import annotations

import hashlib
from array import array

BlockHash = bytes

ROOT_HASH: BlockHash = hashlib.sha256(b"course-kv-prefix-root").digest()


def _hash_block_bytes(parent: BlockHash | None, token_bytes: bytes, extra_keys: tuple | None) -> BlockHash:
    digest = hashlib.sha256(parent or ROOT_HASH)
    digest.update(token_bytes)
    if extra_keys:
        digest.update(repr(tuple(extra_keys)).encode())
    return digest.digest()


def hash_block_tokens(parent: BlockHash | None, token_ids: tuple[int, ...] | list[int],
                      extra_keys: tuple | None = None) -> BlockHash:
    """The hash of one full block given its parent's hash (None for the first block)."""
    return _hash_block_bytes(parent, array("q", token_ids).tobytes(), extra_keys)  # 8 bytes per id: unambiguous


def hash_request_blocks(token_ids: list[int], block_size: int, cache_salt: str | None = None,
                        first_block: int = 0, parent: BlockHash | None = None) -> list[BlockHash]:
    """Hashes of the full blocks in ``token_ids``, which start at block index ``first_block`` of the
    request, chaining from ``parent`` (the hash of block ``first_block - 1``).

    A trailing partial block gets no hash: only full blocks are ever cached.
    """
    encoded = array("q", token_ids).tobytes()  # encode once, then slice per block
    width = 8 * block_size
    hashes = []
    for i in range(len(token_ids) // block_size):
        extra = (cache_salt,) if first_block + i == 0 and cache_salt is not None else None
        parent = _hash_block_bytes(parent, encoded[i * width:(i + 1) * width], extra)
        hashes.append(parent)
    return hashes
