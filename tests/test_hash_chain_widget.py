"""Module 03's hash-chain explorer: edit a prompt, see which blocks still hit, as the engine would."""

import matplotlib
import pytest

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams
from course_lib.widgets.hash_chain_explorer import HashChainExplorer

matplotlib.use("Agg")

SYSTEM = ("You are a helpful assistant for the ACME store. Answer briefly and cite the order number. "
          "Today is 2026-11-30. ")
REFERENCES = {"user 1": SYSTEM + "Where is my order 1234?", "user 2": SYSTEM + "Can I return a jacket?"}
EDITS = [
    SYSTEM + "Can I return a hat?",  # new question: the system prompt's blocks hit
    SYSTEM.replace("2026-11-30", "2026-12-01") + "Can I return a jacket?",  # one early edit breaks the chain there
    "Hi! " + SYSTEM + "Where is my order 1234?",  # a prefix shifts every block: nothing hits
    REFERENCES["user 2"],  # identical: every full block hits, the tail is computed
    SYSTEM[:111],  # 112 tokens with BOS: the last full block holds the last token, so it is recomputed
]


def engine_cached_tokens(prompt, block_size, salt=None, reference_salt=None):
    """``num_cached_tokens`` of ``prompt`` on a fresh tiny engine, served after the references."""
    llm = LLM("tiny-llama", block_size=block_size, max_model_len=256, num_gpu_blocks=64 * 16 // block_size)
    greedy = SamplingParams(temperature=0, max_tokens=4)
    for text in REFERENCES.values():
        llm.generate(text, greedy, cache_salt=reference_salt)
    return llm.generate(prompt, greedy, cache_salt=salt)[0].num_cached_tokens


@pytest.mark.parametrize("block_size", [16, 8])
def test_edited_prompts_hit_what_the_engine_hits(block_size):
    explorer = HashChainExplorer(REFERENCES, "", block_size=block_size)
    seen = set()
    for text in EDITS:
        explorer.prompt.value = text
        assert explorer.hit_tokens == engine_cached_tokens(text, block_size), text
        assert f"{explorer.hit_blocks} of {(len(text) + 1) // block_size} full blocks hit" in explorer.readout.value
        seen.add(explorer.hit_blocks)
    assert len(seen) >= 4  # the edits really differ


def test_cache_salt_isolates_and_a_matching_salt_shares():
    explorer = HashChainExplorer(REFERENCES, EDITS[0], reference_salt="tenant-a")
    assert explorer.hit_blocks == 0 and "no salt and the references use cache_salt" in explorer.readout.value
    explorer.cache_salt.value = "tenant-a"
    assert "no block can match" not in explorer.readout.value
    assert explorer.hit_tokens == engine_cached_tokens(EDITS[0], 16, "tenant-a", "tenant-a") == 112
    explorer.cache_salt.value = "tenant-b"
    assert explorer.hit_tokens == engine_cached_tokens(EDITS[0], 16, "tenant-b", "tenant-a") == 0


def test_readout_names_the_first_missing_block_and_the_figure_follows_edits():
    explorer = HashChainExplorer(REFERENCES, EDITS[1], block_size=16)
    assert "first miss: block 6, <code> is 2026-12-01. </code>" in explorer.readout.value
    explorer.prompt.value = EDITS[4]
    assert "first miss: block 6" in explorer.readout.value and "always computed" in explorer.readout.value
    explorer.prompt.value = EDITS[4][:-1] + "Z"  # same length, but the last block really differs
    assert "first miss: block 6" in explorer.readout.value and "always computed" not in explorer.readout.value
    explorer.prompt.value = REFERENCES["user 2"]
    assert "8 of 8 full blocks hit (128 of 134 prompt tokens)" in explorer.readout.value
    assert "partial block, which is never cached" in explorer.readout.value
    explorer.block_size.value = 32
    assert "4 of 4 full blocks hit (128 of 134" in explorer.readout.value
    ax = explorer.draw().axes[0]
    assert ax.get_title() and "32 tokens per block" in ax.get_xlabel() and ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].startswith("user 1") and labels[-1] == "your prompt\n4/4 blocks hit"


def block_boxes(ax):
    """The hashed blocks' boxes (the partial tail blocks are hatched)."""
    return [patch for patch in ax.patches if not patch.get_hatch()]


@pytest.mark.parametrize("block_size", [4, 8, 16, 32])
def test_every_hash_has_its_own_colour_and_its_label_stays_in_its_box(block_size):
    explorer = HashChainExplorer(REFERENCES, EDITS[1], block_size=block_size)
    fig = explorer.draw()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    boxes = block_boxes(ax)
    hashes = [text.get_text() for text in ax.texts]
    assert len(hashes) == len(boxes)  # at these sizes every block is labelled
    colours = [box.get_facecolor() for box in boxes]
    assert len(set(colours)) == len(set(hashes)) and len(set(zip(colours, hashes))) == len(set(hashes))
    for text, box in zip(ax.texts, boxes):
        inside, outside = text.get_window_extent(renderer), box.get_window_extent(renderer)
        assert outside.x0 <= inside.x0 and inside.x1 <= outside.x1 and outside.y0 <= inside.y0 and inside.y1 <= outside.y1
        assert text.get_fontsize() >= 5


def test_blocks_too_narrow_to_label_say_so():
    explorer = HashChainExplorer(REFERENCES, SYSTEM * 4, block_size=4)
    ax = explorer.draw().axes[0]
    assert not ax.texts and "too narrow to label" in ax.get_xlabel()
    assert len({box.get_facecolor() for box in block_boxes(ax)}) > 100  # still one colour per hash


def test_short_prompts_read_in_whole_words():
    explorer = HashChainExplorer(REFERENCES, "")
    assert "your prompt is empty: only the BOS token" in explorer.readout.value and "1 tokens" not in explorer.readout.value
    explorer.prompt.value = "Hi"
    assert "your prompt is 3 tokens, the BOS token included, less than one block of 16 tokens" in explorer.readout.value
    explorer.prompt.value = SYSTEM[:16]  # 17 tokens: one full block, one token over
    assert "of 1 full block hit" in explorer.readout.value and "the last token fills a partial block" in \
        explorer.readout.value
    assert explorer.prompt.style.description_width == "initial"  # "your prompt" is never cut short
