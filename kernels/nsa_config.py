"""The tuning knobs of :mod:`kernels.nsa_verify` (``NsaVerifyConfig``): how a call tiles its
rows, sizes and merges its slots, picks its blocks and launches; none changes what it computes
beyond the rounding of its fp32 sums."""

from __future__ import annotations

from dataclasses import dataclass, field

from ssvkit.perfmodel import nsa_plan
from ssvkit.perfmodel.numbers import require_at_least_one

SCORE_SOURCES = ("auto", "stored", "computed")
SCORE_MAPS = ("matrix", "band")
MERGES = ("auto", "last", "parallel", "separate")
PICKS = ("folded", "separate")
CONTEXT_TILES = nsa_plan.CONTEXT_TILES


@dataclass(frozen=True, slots=True)
class NsaVerifyConfig:
    """Launch parameters of :func:`nsa_verify` (tuning knobs, not semantics)."""

    block_m: int = field(default=64, metadata={"help": "most packed MMA rows per program"})
    block_n: int = field(
        default=64, metadata={"help": "keys per tile (at most block_size for the selected tiles)"}
    )
    comp_block_n: int = field(
        default=0,
        metadata={
            "help": "keys per tile of a launch of the compressed branch alone (0: block_n, "
            "the other launches' tile; else a power of two >= 16, not bound by block_size, "
            "capped so that a K or V tile holds at most nsa_plan.COMP_TILE_ELEMS elements): "
            "fewer, longer steps of its online softmax. On an H100 at 128K, 128-key tiles take "
            "1.00x the time of 64 on fused calls and up to 1.16x on unfused ones (medians "
            "1.00-1.04x; validation/data/nsa-comp-block-n-h100.json), so 0 is the default"
        },
    )
    wide_tile_elems: int = field(
        default=nsa_plan.WIDE_TILE_ELEMS,
        metadata={
            "help": "most MMA rows x head dim of a row tile at a head dim above 128 (an "
            "mma.sync tile, whose K/V fragments and accumulator sit in registers: at 32 rows "
            "x 256 the forward programs spill); 0: no cap beyond block_m. On an H100 at D = "
            "256, 16-row tiles take 0.45-1.23x the time of 32-row ones, median 0.85x at 8q/4kv "
            "and 0.93x at 16q/8kv (validation/data/nsa-wide-tile-*-h100.json)"
        },
    )
    block_j: int = field(default=64, metadata={"help": "selection blocks scored per program"})
    score_warps: int = field(default=4, metadata={"help": "warps per block-scoring program"})
    num_warps: int = field(
        default=nsa_plan.FORWARD_WARPS, metadata={"help": "warps per forward program"}
    )
    num_stages: int = field(default=3, metadata={"help": "software-pipeline depth of loads"})
    num_splits: int = field(
        default=0,
        metadata={
            "help": "slots per (seq, KV head, row tile), shared by the branches (at least "
            "one each); 0 = enough to fill the SMs"
        },
    )
    ctas_per_sm: int = field(default=1, metadata={"help": "resident programs per SM assumed"})
    compressed_ctas: int = field(
        default=nsa_plan.COMPRESSED_CTAS_PER_SM,
        metadata={
            "help": "resident programs per SM a launch of the compressed branch alone is sized "
            "for where one would leave each row tile a single slot "
            "(perfmodel.nsa_slots.compressed_capacity)"
        },
    )
    min_tiles_per_slot: int = field(
        default=2, metadata={"help": "fewest key tiles a slot is given when sizing slots"}
    )
    max_splits: int = field(default=64, metadata={"help": "upper bound on slots per tile"})
    expected_overlap: float = field(
        default=0.7, metadata={"help": "row-to-row block overlap assumed to size the slots"}
    )
    rows_per_tile: int = field(
        default=0,
        metadata={
            "help": "most draft rows of one row tile, which share one load of their selected "
            "blocks' union (1: each row streams its own; 0: as many as fit); rounded down to "
            "a power of two"
        },
    )
    warpgroup_rows_from: int = field(
        default=nsa_plan.WGMMA_MIN_ROWS // 2 + 1,
        metadata={
            "help": "packed MMA rows from which a row tile under 64 rows takes 64 (a wgmma "
            "warpgroup tile, its extra head slots masked) in place of mma.sync; the default "
            "(33) pads none: a 32-row tile stays 32 rows. On an H100 the padded tile takes "
            "0.96-1.08x the time at Llama-3.1-8B attention and 0.89-0.94x in fused calls at "
            "batch 16 at 8 query / 2 KV heads of 64 (validation/data/nsa-row-tile-h100-*.json, "
            "python -m ssvkit.validation.nsa_tile_plans --knob warpgroup_rows)"
        },
    )
    score_source: str = field(
        default="auto",
        metadata={
            "help": "where the refresh path's block scoring gets the compressed scores: "
            "stored by the compressed launch, computed again from the compressed keys, or "
            "auto (whichever moves fewer bytes)"
        },
    )
    score_map: str = field(
        default="band",
        metadata={
            "help": "how the computed block scoring maps compressed tokens onto selection "
            "blocks: band (kernels.nsa_band_scores: one band every key tile shares, where the "
            "block size is a multiple of the compression stride, else matrix; refresh calls "
            "0.8-1.0x matrix's time on the H200, validation/data/nsa-score-map-h200.json) or "
            "matrix (a 0/1 overlap matrix over the program's blocks, built per key tile)"
        },
    )

    merge: str = field(
        default="separate",
        metadata={
            "help": "how a call merges its slots: separate (a launch of its own; the fastest "
            "measured on the H200, validation/data/nsa-stages-h200.json), or in the forward "
            "launch, by the last program of a row tile to finish (last) or by merge programs, "
            "one per draft row (parallel), auto choosing (kernels.nsa_steps.merge_layout)"
        },
    )

    pick: str = field(
        default="separate",
        metadata={
            "help": "where the refresh path picks its top-n blocks: separate (a launch of its "
            "own; no slower than the fold on the H200, and on an H100 at 128K, batch 1 the "
            "folded launch takes 9.3 us against 3.4 + 4.2 apart at t = 1 and 22.7 against "
            "11.5 + 4.7 at t = 16: validation/data/nsa-launches-pick-h100.json) or folded into "
            "the block scoring launch (where kernels.top_blocks' threshold pick serves the rows)"
        },
    )

    tile_plan: str = field(
        default=nsa_plan.DEFAULT_TILE_PLAN,
        metadata={
            "help": "row tiles and slots: fixed (tiles of at most block_m MMA rows and 16 "
            "draft rows, slots within one wave; the plan the committed rows were measured "
            "with) or fit (tiles of up to 128 MMA rows and 32 draft rows on 4 warps per 64 "
            "rows, so Llama-3.1-8B's 17-32 draft rows stay one tile; slots sized by the "
            "launch's makespan, a second wave allowed; perfmodel.nsa_slots.fit_slots) or "
            "fit_slots (fixed's tiles, fit's slots)"
        },
    )

    context_tiles: str = field(
        default=nsa_plan.DEFAULT_CONTEXT_TILES,
        metadata={
            "help": "row tiles of the compressed branch: shared (the tiles of rows_per_tile "
            "= 0, in a launch of their own, where that is fewer tiles: every draft row sees "
            "the same compressed tokens, so one tile of all rows reads them once; the "
            "selected and window branches keep rows_per_tile's tiles; fused calls at 128K "
            "0.30-0.98x per_tile's time, at 32K 0.55-1.16x, "
            "validation/data/nsa-context-tiles-h200.json), paired (shared, and a reuse "
            "call's compressed launch and its selected and window launch run as one, "
            "kernels.nsa_pair, where one wave holds both: perfmodel.nsa_plan.pairs_launches) "
            "or per_tile (the row tiles of rows_per_tile, each streaming every compressed "
            "token). Takes the separate merge; the folded merges keep per_tile"
        },
    )

    pdl: bool = field(
        default=False,
        metadata={
            "help": "launch each step after a call's first as a programmatic dependent of the "
            "one before (kernels.pdl; compute capability 9.0 or later): it starts while that "
            "one drains; the same output"
        },
    )

    branch_streams: bool = field(
        default=nsa_plan.DEFAULT_BRANCH_STREAMS,
        metadata={
            "help": "the unfused baseline (nsa_verify_unfused) runs its branches side by side "
            "on streams of their own (kernels.branch_streams): the window branch beside the "
            "compressed branch and the selection, the compressed branch's merge beside the "
            "selected branch; the same output; on the H200 reuse calls 0.55-1.12x the time "
            "of one stream, refresh calls 0.84-1.01x (validation/data/nsa-branch-streams-h200.json)"
        },
    )

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_j"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")
        v = self.comp_block_n
        if v and (v < 16 or v & (v - 1)):
            raise ValueError(f"comp_block_n must be 0 or a power of two >= 16, got {v}")
        for name in ("num_warps", "score_warps"):
            if getattr(self, name) not in (1, 2, 4, 8, 16):
                raise ValueError(f"{name} must be a power of two <= 16, got {getattr(self, name)}")
        require_at_least_one(
            self,
            (
                "num_stages",
                "ctas_per_sm",
                "compressed_ctas",
                "max_splits",
                "min_tiles_per_slot",
                "warpgroup_rows_from",
            ),
        )
        if self.wide_tile_elems < 0:
            raise ValueError(f"wide_tile_elems must be >= 0, got {self.wide_tile_elems}")
        if self.rows_per_tile < 0:
            raise ValueError(f"rows_per_tile must be >= 0, got {self.rows_per_tile}")
        if self.num_splits < 0:
            raise ValueError(f"num_splits must be >= 0, got {self.num_splits}")
        if self.score_source not in SCORE_SOURCES:
            raise ValueError(
                f"score_source must be one of {', '.join(SCORE_SOURCES)}, got {self.score_source!r}"
            )
        for name, allowed in (
            ("merge", MERGES),
            ("pick", PICKS),
            ("tile_plan", nsa_plan.TILE_PLANS),
            ("context_tiles", CONTEXT_TILES),
            ("score_map", SCORE_MAPS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if not 0.0 <= self.expected_overlap <= 1.0:
            raise ValueError(f"expected_overlap must be in [0, 1], got {self.expected_overlap}")


DEFAULT_CONFIG = NsaVerifyConfig()
