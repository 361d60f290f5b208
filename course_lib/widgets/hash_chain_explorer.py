"""Edit a prompt and watch its prefix-cache hits: reference prompts fill the cache first, then
yours is looked up block by block, with the engine's own hashing and byte tokenizer.

Invariant: the readout's hit tokens are what the real engine reports as ``num_cached_tokens``
for your prompt, served right after the references into an empty cache with the same block
size and salts (an empty salt box means no ``cache_salt``).
"""

from __future__ import annotations

import html
import time

import ipywidgets as w

from course_lib.models.tokenizer import ByteTokenizer
from course_lib.widgets.figure_pane import FigurePane, new_figure, one_at_a_time
from course_lib.widgets.hash_chain import draw_hash_chains, hash_chains, prefix_hits
from course_lib.widgets.selection_readout import with_readout

BLOCK_SIZES = [4, 8, 16, 32]
TOKENIZER = ByteTokenizer()


def block_text(tokens: list[int], index: int, block_size: int) -> str:
    """The text of block ``index`` (the BOS token shown as ⟨bos⟩)."""
    block = tokens[index * block_size:(index + 1) * block_size]
    bos = "⟨bos⟩" if block and block[0] == TOKENIZER.bos_token_id else ""
    return bos + TOKENIZER.decode(block)


def describe_hits(tokens: list[int], hit_blocks: int, block_size: int, next_is_cached: bool) -> str:
    """The "k of n full blocks hit (m tokens)" line and where the hits stop, as HTML.
    ``next_is_cached``: the block after the hits is in the cache (so only the last-token rule stops it)."""
    full = len(tokens) // block_size
    if full == 0:
        what = "empty: only the BOS token" if len(tokens) == 1 else f"{len(tokens)} tokens, the BOS token included"
        return (f"<b>No full block, so nothing to hit</b>: your prompt is {what}, less than one block of {block_size} "
                "tokens; a partial block is never cached.")
    text = (f"<b>{hit_blocks} of {full} full block{'s' if full > 1 else ''} hit "
            f"({hit_blocks * block_size} of {len(tokens)} prompt tokens)</b>")
    if hit_blocks < full:
        missed = html.escape(block_text(tokens, hit_blocks, block_size))
        why = " (it is cached, but it holds your last prompt token, which is always computed)" if next_is_cached else ""
        return f"{text}; first miss: block {hit_blocks}, <code>{missed}</code>{why}."
    tail = len(tokens) - full * block_size
    tail_text = "the last token fills" if tail == 1 else f"the last {tail} tokens fill"
    return f"{text}; {tail_text} a partial block, which is never cached."


def salt_note(salt: str | None, reference_salt: str | None) -> str:
    """Why nothing can hit when the salts differ (empty when they agree), as HTML."""
    if salt == reference_salt:
        return ""
    def name(s: str | None) -> str:
        return "no salt" if s is None else f"cache_salt <code>{html.escape(s)}</code>"
    return (f" You use {name(salt)} and the references use {name(reference_salt)}: no block can match, because "
            "the salt is inside block 0's hash and every later hash contains block 0's.")


class HashChainExplorer(w.VBox):
    """A text box for your prompt, served after ``references`` (name -> text), which fill the
    cache; a block-size slider and a ``cache_salt`` box. Every edit rehashes and redraws
    (about 0.1 s), so the text boxes update as you type."""

    def __init__(self, references: dict[str, str], prompt: str, block_size: int = 16, cache_salt: str = "",
                 reference_salt: str | None = None) -> None:
        self.references, self.reference_salt = references, reference_salt
        self.prompt = w.Textarea(prompt, description="your prompt", rows=3, layout=w.Layout(width="95%"),
                                 style={"description_width": "initial"})
        self.block_size = w.SelectionSlider(options=BLOCK_SIZES, value=block_size, description="block_size",
                                            continuous_update=False)
        self.cache_salt = w.Text(cache_salt, description="cache_salt", placeholder="empty: no salt")
        self.readout, self.figure = w.HTML(), FigurePane()
        for control in (self.prompt, self.block_size, self.cache_salt):
            control.observe(lambda _: self.refresh(), "value")
        super().__init__([self.prompt, w.HBox([with_readout(self.block_size), self.cache_salt]), self.readout, self.figure])
        self.refresh()

    def served(self) -> tuple[dict[str, list[int]], dict[str, str | None]]:
        """Token ids in serving order (the references, then "your prompt") and each one's salt."""
        prompts = {name: TOKENIZER.encode(text) for name, text in self.references.items()}
        salts = {name: self.reference_salt for name in self.references}
        prompts["your prompt"] = TOKENIZER.encode(self.prompt.value)
        salts["your prompt"] = self.cache_salt.value or None
        return prompts, salts

    def draw(self):
        """The hash chains of the references and your prompt, one row each."""
        prompts, salts = self.served()
        fig = new_figure(11, 0.9 * len(prompts) + 1)
        ax = fig.subplots()
        draw_hash_chains(ax, prompts, self.block_size.value, salts)
        ax.set_title("Block hashes (same colour = same hash = shared KV)")
        fig.tight_layout()
        return fig

    @one_at_a_time
    def refresh(self) -> float:
        """Rehash, redraw and rewrite the readout; returns the seconds it took."""
        started = time.perf_counter()
        prompts, salts = self.served()
        chains, hits = hash_chains(prompts, self.block_size.value, salts)
        self.hit_blocks = hits[-1]
        next_is_cached = prefix_hits(chains)[-1] > self.hit_blocks
        self.hit_tokens = self.hit_blocks * self.block_size.value
        self.figure.redraw(self.draw)
        elapsed = time.perf_counter() - started
        hits_line = describe_hits(prompts["your prompt"], self.hit_blocks, self.block_size.value, next_is_cached)
        self.readout.value = (f"{hits_line}{salt_note(salts['your prompt'], self.reference_salt)} "
                              f"<small>(updated in {1000 * elapsed:.0f} ms)</small>")
        return elapsed
