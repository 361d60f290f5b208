"""Byte-level tokenizer: token ids 0-255 are bytes, then BOS and EOS. Nothing to download."""

from __future__ import annotations


class ByteTokenizer:
    """Invariant: ``decode(encode(text)) == text`` for any text (UTF-8 round trip)."""

    bos_token_id = 256
    eos_token_id = 257
    vocab_size = 258

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return ([self.bos_token_id] if add_bos else []) + list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")
