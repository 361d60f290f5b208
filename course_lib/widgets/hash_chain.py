"""The prefix cache's hash chain drawn as coloured blocks: equal colours are equal hashes and
different hashes get different colours, so shared KV is visible at a glance, and so is the
point where two prompts part. Each block is labelled with its hash's first hex digits, at a size
and angle that keep the label inside its box (or not at all, when boxes are too narrow to read)."""

from __future__ import annotations

import colorsys

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from course_lib.engine.block_hash import hash_request_blocks
from course_lib.widgets.box_labels import label_style


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


LABEL_DIGITS = 4  # hex digits of a hash shown on its block
BOX_WIDTH, BOX_HEIGHT = 0.92, 0.8  # a block's box, in block and row units


def distinct_colours(count: int) -> list[tuple[float, float, float]]:
    """``count`` different colours: matplotlib's tab20 while it lasts, then hues a golden-ratio step
    apart at three lightnesses, so that neighbours in the list stay far apart."""
    if count <= 20:
        return [plt.get_cmap("tab20")(i)[:3] for i in range(count)]
    return [colorsys.hls_to_rgb((i * 0.618033988749895) % 1.0, (0.45, 0.62, 0.78)[i % 3], 0.65) for i in range(count)]


def ink_on(colour: tuple[float, float, float]) -> str:
    """Black or white, whichever reads better on ``colour`` (by its relative luminance)."""
    red, green, blue = colour
    return "black" if 0.2126 * red + 0.7152 * green + 0.0722 * blue > 0.4 else "white"


def draw_hash_chains(ax, prompts: dict[str, list[int]], block_size: int,
                     cache_salts: dict[str, str | None] | None = None) -> list[int]:
    """One row per prompt (served in the given order), one box per block, coloured by its hash (one
    colour per distinct hash) and labelled with the hash's first hex digits when they fit. Returns
    each row's number of hit blocks."""
    chains, hits = hash_chains(prompts, block_size, cache_salts)
    distinct = list(dict.fromkeys(block_hash for chain in chains for block_hash in chain))
    colour_of = dict(zip(distinct, distinct_colours(len(distinct))))
    width = max(len(tokens) for tokens in prompts.values()) / block_size + 1
    style = label_style(ax, width + 0.1, len(prompts), LABEL_DIGITS, BOX_WIDTH, BOX_HEIGHT)
    labels = []
    for row, ((name, tokens), chain, hit) in enumerate(zip(prompts.items(), chains, hits)):
        y = len(prompts) - 1 - row
        for index, block_hash in enumerate(chain):
            ax.add_patch(Rectangle((index, y + 0.1), BOX_WIDTH, BOX_HEIGHT, facecolor=colour_of[block_hash],
                                   edgecolor="black", lw=2.5 if index < hit else 0.5))
            if style:
                ax.text(index + BOX_WIDTH / 2, y + 0.5, block_hash.hex()[:LABEL_DIGITS], ha="center", va="center",
                        color=ink_on(colour_of[block_hash]), **style)
        if len(tokens) % block_size:  # the partial tail block: never hashed, never cached
            ax.add_patch(Rectangle((len(chain), y + 0.1), BOX_WIDTH * (len(tokens) % block_size) / block_size, BOX_HEIGHT,
                                   facecolor="white", edgecolor="grey", hatch="//", lw=0.5))
        labels.append(f"{name}\n{hit}/{len(chain)} blocks hit" if row else f"{name}\n(fills the cache)")
    ax.set_yticks([len(prompts) - 0.5 - row for row in range(len(prompts))], labels, fontsize=9)
    ax.tick_params(axis="y", length=0)
    ax.set(xlim=(-0.1, width), ylim=(0, len(prompts)), ylabel="request (served top to bottom)",
           xlabel=f"block index ({block_size} tokens per block; thick edge: prefix-cache hit; hatched: partial block"
                  f"{'' if style else '; blocks too narrow to label'})")
    return hits
