"""The course's text: Python's own help topics (``pydoc_data.topics``) as byte-level token streams.

Training (``models/train.py``), fp8 KV calibration (passed in by the engine, ``quant/kv_fp8.py``),
the accuracy gate and the benchmarks all read the same streams from here. The rows of '*', '=',
'-', '~' or '^' that underline headings are removed first (greedy samples collapse into them
otherwise). Invariant: the split is deterministic, so "held out" means the same tokens everywhere.
"""

from __future__ import annotations

import re

import torch

from course_lib.models.tokenizer import ByteTokenizer

UNDERLINE = re.compile(r"^\s*([*=\-~^])\1{2,}\s*$")
HELD_OUT_SHARE = 0.1


def without_underlines(text: str) -> str:
    """``text`` without the rows that only underline a heading."""
    return "\n".join(line for line in text.splitlines() if not UNDERLINE.match(line))


def corpus() -> tuple[torch.Tensor, torch.Tensor]:
    """Train and held-out token streams: every topic (sorted by name) as BOS + bytes + EOS, last 10% held out."""
    from pydoc_data.topics import topics

    tokenizer, stream = ByteTokenizer(), []
    for name in sorted(topics):
        stream += tokenizer.encode(without_underlines(topics[name])) + [tokenizer.eos_token_id]
    data = torch.tensor(stream, dtype=torch.long)
    split = int(len(data) * (1 - HELD_OUT_SHARE))
    return data[:split], data[split:]
