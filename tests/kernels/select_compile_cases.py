"""The selection's Triton kernels compiled for Hopper without a GPU (``kernels.offline_compile``):
run as a script with ``TRITON_INTERPRET`` unset (``test_select_blocks`` spawns it). Prints one
line a compiled kernel and ``compiled N`` last; a compiler error ends it with a traceback."""

from __future__ import annotations

import os

import torch
from ssvkit.kernels import block_scores as bs
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.kernels.block_metadata_kernels import block_metadata_kernel
from ssvkit.kernels.offline_compile import compile_offline
from ssvkit.kernels.select_kernels import block_scores_kernel, select_kernel
from ssvkit.kernels.tile_pick_kernels import tile_pick_kernel
from ssvkit.kernels.top_blocks import threshold_meta, tile_pick_meta

assert "TRITON_INTERPRET" not in os.environ, "run with TRITON_INTERPRET unset"

SCORE_POINTERS = {
    "q_ptr": "*bf16",
    "mean_ptr": "*bf16",
    "min_ptr": "*bf16",
    "max_ptr": "*bf16",
    "prefix_ptr": "*i32",
    "out_ptr": "*fp32",
    "tmax_ptr": "*i32",
}
SELECT_POINTERS = {
    **SCORE_POINTERS,
    "score_ptr": "*fp32",
    "out_ptr": "*i32",
    "scratch_ptr": "*i64",
    "counter_ptr": "*i32",
    "pos_ptr": "*i64",
}
# (method, head dimension, draft rows): the narrowest and the widest score operands.
CASES = [("mean", 64, 1), ("mean", 128, 16), ("quest", 128, 20), ("quest", 256, 40)]
TILE_PICK_POINTERS = {
    "score_ptr": "*fp32",
    "tmax_ptr": "*i32",
    "prefix_ptr": "*i32",
    "out_ptr": "*i32",
    "scratch_ptr": "*i32",
    "pos_ptr": "*i64",
}
NUM_Q_HEADS, NUM_KV_HEADS, NUM_BLOCKS, TOP_N = 8, 2, 300, 16
# (blocks, top_n, forced, tile width, window slots): the prefix rule at a long and a short
# row, the position-relative rule, a top_n whose gathered tile is a whole chunk.
TILE_PICK_CASES = [
    (2049, 16, 2, 32, 0),
    (300, 16, 2, 16, 0),
    (2049, 16, 1, 32, 9),
    (9000, 64, 2, 32, 0),
]


def score_launch(method: str, d: int, t: int) -> bs.ScoreLaunch:
    """The wrapper's score launch of the case, at its first score shape, on CPU tensors."""
    q = torch.zeros((1, t, NUM_Q_HEADS, d), dtype=torch.bfloat16)
    values = torch.zeros((1, NUM_KV_HEADS, NUM_BLOCKS, d))
    kw = {"mean": values} if method == "mean" else {"kmin": values, "kmax": values}
    meta = BlockMetadata.from_values(64, **kw)
    lens = torch.full((1,), NUM_BLOCKS * 64, dtype=torch.int32)
    t_pad = max(16, 1 << (t - 1).bit_length())
    shape = bs._score_shapes(t_pad, d, method)[0]
    return bs._score_launch(q, meta, lens, method, shape)


def main() -> None:
    count = 0
    for method, d, t in CASES:
        launch = score_launch(method, d, t)
        meta = {**launch.meta, "PRECISION": "bf16x3"}
        for pdl, tile_max in ((False, False), (True, False), (True, True)):
            k = compile_offline(
                block_scores_kernel,
                SCORE_POINTERS,
                {**meta, "PDL": pdl, "TILE_MAX": tile_max},
                num_warps=launch.num_warps,
            )
            count += 1
            print(
                f"block_scores {method} D={d} t={t} pdl={pdl} tile_max={tile_max}: "
                f"{k.metadata.shared} B shared"
            )
        pick = threshold_meta(NUM_BLOCKS, TOP_N)
        constexprs = {**meta, **pick, "NUM_KV_HEADS": NUM_KV_HEADS, "LOCAL_SLOTS": 0, "PDL": False}
        k = compile_offline(select_kernel, SELECT_POINTERS, constexprs, num_warps=4)
        count += 1
        print(f"select {method} D={d} t={t}: {k.metadata.shared} B shared")
    for blocks, top_n, forced, width, slots in TILE_PICK_CASES:
        pick = tile_pick_meta(blocks, top_n, forced - 1, 1, width)
        constexprs = {**pick, "NUM_KV_HEADS": 8, "BLOCK_SIZE": 64, "LOCAL_SLOTS": slots}
        compile_offline(
            tile_pick_kernel, TILE_PICK_POINTERS, {**constexprs, "PDL": True}, num_warps=1
        )
        count += 1
        print(f"tile_pick blocks={blocks} top_n={top_n} W={width} slots={slots}")
    for d in (64, 256):
        constexprs = dict(NUM_PROGS=2, BLOCK_SIZE=64, D=d, HAS_MEAN=True, HAS_MINMAX=True)
        pointers = {"k_ptr": "*bf16", "old_ptr": "*i32", "new_ptr": "*i32"}
        pointers |= {name: "*bf16" for name in ("mean_ptr", "min_ptr", "max_ptr")}
        compile_offline(block_metadata_kernel, pointers, constexprs, num_warps=4)
        count += 1
        print(f"block_metadata D={d}")
    print(f"compiled {count}")


if __name__ == "__main__":
    main()
