"""What the command-line scripts in tests/cli share: the failed-check list and the check() that fills it, and a
small token shard in the trainer's format (256 int32 header words: magic, version, count; then uint16 tokens)."""
from __future__ import annotations

import struct

FAILS: list[str] = []


def check(cond: bool, msg: str, quiet: bool = False) -> None:
    """Record msg as failed unless cond; print it either way (only failures when quiet)."""
    if cond and quiet:
        return
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        FAILS.append(msg)


def write_shard(path: str, n: int, vocab: int, wobble: bool = True) -> None:
    """n tokens below vocab, each a function of its position (wobble adds a slow 5-cycle so that nearby windows
    differ in more than an offset)."""
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, n
    tokens = [(i * 7 + 3 + ((i // 13) % 5 if wobble else 0)) % vocab for i in range(n)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{n}H", *tokens))
