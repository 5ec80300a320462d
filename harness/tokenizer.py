"""Byte tokenizer for the embedded models: ids 0..255 are bytes; a few specials follow."""

from __future__ import annotations

BOS, EOS, PAD = 256, 257, 258
SPECIALS = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}
VOCAB_SIZE = 260  # 256 bytes + BOS, EOS, PAD + one spare


def encode(text: str) -> list:
    """UTF-8 bytes of ``text`` as ids (no BOS added)."""
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    """Bytes back to text (invalid UTF-8 replaced); specials shown as ``<name>``."""
    out, buf = [], bytearray()
    for i in ids:
        i = int(i)
        if 0 <= i < 256:
            buf.append(i)
            continue
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
        out.append(SPECIALS.get(i, f"<{i}>"))
    if buf:
        out.append(buf.decode("utf-8", errors="replace"))
    return "".join(out)
