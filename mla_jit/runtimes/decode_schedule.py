"""The decode scheduler's work split (decode/metadata.cuh, its greedy form) computed on the host.

The metadata kernel computes it on the GPU so that a CUDA graph can replay it over new lengths; where
the lengths are known on the host (the sparse decode: every row has topk keys), the same split tells the
plan what the schedule will hold without reading it back: whether any row is cut into several splits,
i.e. whether the combine kernel has anything to merge. A GPU test compares this with the kernel's output.
"""
from __future__ import annotations

from typing import Sequence

META_SIZE = 8   # int32 a part: begin_batch, begin_token, end_batch, end_token (exclusive), begin_split, 0, 0, 0


def greedy_schedule(lengths: Sequence[int], parts: int, block_n: int,
                    overhead: int) -> tuple[list[list[int]], list[int]]:
    """(metadata rows, num_splits) of the greedy split of `lengths` over `parts` SM parts, as
    mla_metadata_body writes them: a sequence costs ceil(L / block_n) blocks plus `overhead` a split,
    every part gets ceil(total / parts) + overhead, the last part takes what is left."""
    b = len(lengths)
    total = sum(-(-n // block_n) + overhead for n in lengths if n > 0)
    payload = -(-total // parts) + overhead
    meta: list[list[int]] = []
    num_splits = [0] * (b + 1)
    cur_b = cur_blk = cur_split = prefix = 0
    for part in range(parts):
        while cur_b < b and lengths[cur_b] <= 0:   # a part never starts on an empty sequence
            num_splits[cur_b + 1] = prefix
            cur_b += 1
        if cur_b >= b:
            meta.append([0] * META_SIZE)
            continue
        row = [cur_b, cur_blk * block_n, cur_b, 0, cur_split, 0, 0, 0]
        remain = 1 << 62 if part == parts - 1 else payload
        while cur_b < b:
            n = lengths[cur_b]
            if n <= 0:
                num_splits[cur_b + 1] = prefix
                cur_b += 1
                continue
            left = -(-n // block_n) - cur_blk
            if remain >= left + overhead:   # the sequence ends in this part
                remain -= left + overhead
                prefix += cur_split + 1
                num_splits[cur_b + 1] = prefix
                row[2], row[3] = cur_b, n
                cur_b += 1
                cur_blk = cur_split = 0
                if remain <= overhead:
                    break
            else:                           # what fits, at least a block; the rest in the next part
                cur_blk += max(remain - overhead, 1)
                row[2], row[3] = cur_b, cur_blk * block_n
                cur_split += 1
                break
        meta.append(row)
    for i in range(cur_b, b):
        num_splits[i + 1] = prefix
    return meta, num_splits


def splits_a_row(rows: int, length: int, parts: int, block_n: int, overhead: int) -> bool:
    """Whether the greedy split of `rows` sequences of `length` > 0 keys cuts any of them in two
    (greedy_schedule's answer in closed form: a plan may serve millions of rows). Until a row is cut,
    every part starts on a row boundary with the same payload P; it finishes k = P // c rows of cost
    c = blocks + overhead, then stops if the remainder P - k c is at most the overhead (a fresh piece
    would hold no block), else cuts the next row if one is left. The last part takes everything."""
    if rows <= 0 or length <= 0 or parts <= 1:
        return False
    cost = -(-length // block_n) + overhead
    payload = -(-(rows * cost) // parts) + overhead
    whole = payload // cost
    if whole == 0:
        return True   # the first part cuts the first row (rows >= 1, parts >= 2)
    return payload - whole * cost > overhead and rows > whole
