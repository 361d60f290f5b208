"""Train the course's tiny byte-level Llama on text that ships with Python (``pydoc_data.topics``).

    python -m course_lib.models.train --preset tiny   # ~10 minutes on 2 CPU cores (500 steps of 8 x 256 bytes)
    python -m course_lib.models.train --preset draft  # a few minutes; the speculative-decoding draft

The corpus is Python's own help text (``models/corpus.py``). Training is budgeted by
steps; the checkpoint with the best held-out loss is saved as a Hugging Face Llama folder.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib.models.corpus import corpus
from course_lib.models.llama import LlamaConfig, LlamaForCausalLM
from course_lib.models.loader import ASSETS, save_pretrained

PRESETS = {
    "tiny": dict(config=LlamaConfig(), steps=500, batch=8, lr=3e-3),
    "draft": dict(config=LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     num_key_value_heads=1, intermediate_size=192), steps=1200, batch=8, lr=4e-3),
}
CONTEXT = 256


def batches(data: torch.Tensor, batch: int, generator: torch.Generator):
    while True:
        starts = torch.randint(0, len(data) - CONTEXT - 1, (batch,), generator=generator)
        window = torch.stack([data[s:s + CONTEXT + 1] for s in starts.tolist()])
        yield window[:, :-1], window[:, 1:]


@torch.no_grad()
def held_out_loss(model: LlamaForCausalLM, data: torch.Tensor, windows: int = 48) -> float:
    starts = torch.linspace(0, len(data) - CONTEXT - 2, windows).long().tolist()
    window = torch.stack([data[s:s + CONTEXT + 1] for s in starts])
    logits = model.forward_dense(window[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten()).item()


def train(preset: str, out: Path, seed: int = 0) -> dict:
    spec = PRESETS[preset]
    torch.manual_seed(seed)
    train_data, val_data = corpus()
    model = LlamaForCausalLM(spec["config"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    steps, warmup = spec["steps"], 50
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / steps))))
    stream = batches(train_data, spec["batch"], torch.Generator().manual_seed(seed))
    best, started = float("inf"), time.time()
    for step in range(1, steps + 1):
        inputs, targets = next(stream)
        loss = F.cross_entropy(model.forward_dense(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == steps:
            model.eval()
            val = held_out_loss(model, val_data)
            model.train()
            marker = ""
            if val < best:
                best, marker = val, " (saved)"
                save_pretrained(model, out)
            print(f"step {step}/{steps}  train {loss.item():.3f}  held-out {val:.3f} nats "
                  f"= {val / math.log(2):.2f} bits/byte  {time.time() - started:.0f}s{marker}", flush=True)
    card = {"preset": preset, "steps": steps, "seconds": round(time.time() - started),
            "held_out_bits_per_byte": round(best / math.log(2), 3),
            "parameters": sum(p.numel() for p in model.parameters()), "corpus": "pydoc_data.topics",
            "command": f"python -m course_lib.models.train --preset {preset}"}
    (out / "training.json").write_text(json.dumps(card, indent=2))
    return card


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--out", type=Path, help="output folder (default: course_lib/models/assets/<name>)")
    args = parser.parse_args()
    out = args.out or ASSETS / {"tiny": "tiny-llama", "draft": "tiny-llama-draft"}[args.preset]
    print(json.dumps(train(args.preset, out), indent=2))


if __name__ == "__main__":
    main()
