"""The prefix cache's hash chain drawn as coloured blocks: equal colours are equal hashes,
so shared KV is visible at a glance, and so is the point where two prompts part."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from course_lib.engine.block_hash import hash_request_blocks


def prefix_hits(chains: list[list[bytes]]) -> list[int]:
    """For each chain, how many leading blocks an earlier chain already cached (the lookup
    walks the chain and stops at the first miss)."""
    seen: set[bytes] = set()
    hits = []
    for chain in chains:
        count = 0
        while count < len(chain) and chain[count] in seen:
            count += 1
        hits.append(count)
        seen.update(chain)
    return hits


def cached_prefix_blocks(chains: list[list[bytes]], prompt_lengths: list[int], block_size: int) -> list[int]:
    """``prefix_hits`` as the engine counts them: the prompt's last token is always computed (its
    logits are needed), so the block holding it is never a hit."""
    return [min(hit, (length - 1) // block_size) for hit, length in zip(prefix_hits(chains), prompt_lengths)]


def hash_chains(prompts: dict[str, list[int]], block_size: int,
                cache_salts: dict[str, str | None] | None = None) -> tuple[list[list[bytes]], list[int]]:
    """Each prompt's block hashes, and its hit blocks when the prompts are served in the given
    order into an empty cache that nothing evicts (each prompt's ``num_cached_tokens`` is its
    hit blocks times ``block_size``)."""
    cache_salts = cache_salts or {}
    chains = [hash_request_blocks(tokens, block_size, cache_salts.get(name)) for name, tokens in prompts.items()]
    return chains, cached_prefix_blocks(chains, [len(tokens) for tokens in prompts.values()], block_size)


def draw_hash_chains(ax, prompts: dict[str, list[int]], block_size: int,
                     cache_salts: dict[str, str | None] | None = None) -> list[int]:
    """One row per prompt (served in the given order), one box per block, labelled with the
    first hex digits of its hash. Returns each row's number of hit blocks."""
    chains, hits = hash_chains(prompts, block_size, cache_salts)
    palette = plt.get_cmap("tab20")
    colour_of: dict[bytes, tuple] = {}
    labels = []
    for row, ((name, tokens), chain, hit) in enumerate(zip(prompts.items(), chains, hits)):
        y = len(prompts) - 1 - row
        for index, block_hash in enumerate(chain):
            colour = colour_of.setdefault(block_hash, palette(len(colour_of) % 20))
            ax.add_patch(Rectangle((index, y + 0.1), 0.92, 0.8, facecolor=colour,
                                   edgecolor="black", lw=2.5 if index < hit else 0.5))
            ax.text(index + 0.46, y + 0.5, block_hash.hex()[:4], ha="center", va="center", fontsize=9)
        if len(tokens) % block_size:  # the partial tail block: never hashed, never cached
            ax.add_patch(Rectangle((len(chain), y + 0.1), 0.92 * (len(tokens) % block_size) / block_size, 0.8,
                                   facecolor="white", edgecolor="grey", hatch="//", lw=0.5))
        labels.append(f"{name}\n{hit}/{len(chain)} blocks hit" if row else f"{name}\n(fills the cache)")
    width = max(len(tokens) for tokens in prompts.values()) / block_size + 1
    ax.set_yticks([len(prompts) - 0.5 - row for row in range(len(prompts))], labels, fontsize=9)
    ax.tick_params(axis="y", length=0)
    ax.set(xlim=(-0.1, width), ylim=(0, len(prompts)), ylabel="request (served top to bottom)",
           xlabel=f"block index ({block_size} tokens per block; thick edge: prefix-cache hit; hatched: partial block)")
    return hits
