"""Byte-level tokenizer: token ids 0-255 are bytes, then the special tokens BOS and EOS. Nothing to download."""

from __future__ import annotations


class ByteTokenizer:
    """Invariant: ``decode(encode(text)) == text`` for any text (UTF-8 round trip; ``decode`` skips
    the special tokens unless ``skip_special_tokens=False``, which writes them as ``<s>`` and ``</s>``)."""

    bos_token_id = 256
    eos_token_id = 257
    vocab_size = 258
    special_tokens = {bos_token_id: "<s>", eos_token_id: "</s>"}

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return ([self.bos_token_id] if add_bos else []) + list(text.encode("utf-8"))

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")
        text, run = [], []  # bytes between special tokens decode together (a character may span tokens)
        for token in token_ids:
            if token < 256:
                run.append(token)
                continue
            text += [bytes(run).decode("utf-8", errors="replace"), self.special_tokens[token]]
            run = []
        return "".join(text) + bytes(run).decode("utf-8", errors="replace")
