"""How fast a few SMs stream from HBM: a read-only kernel of one program an SM on 1 to all of
the GPU's SMs (and of two an SM on all of them), each program reading its own 64 MiB in 16 KiB
tiles three in flight (the pipeline depth and tile size of ``dense_verify``'s K/V walk), timed
by CUDA-graph replay with the L2 flushed (``kernels.timing.bench_graph``).

    python -m ssvkit.validation.sm_streams --out validation/data/sm-streams-h200.json

The rows give the aggregate and the per-SM read rate at each SM count. They are the physical
side of ``perfmodel.dense_work``'s ``tail_bytes``: a call whose last programs run on a few SMs
streams them at what those SMs alone reach, not at the whole GPU's rate over the SMs. A grid of
at most one program per SM lands on distinct SMs (the block scheduler fills SMs breadth first),
so two programs an SM are timed on every SM only.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import triton
import triton.language as tl
from ssvkit.kernels import timing as tm
from ssvkit.kernels.device import num_sms
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write

PROGRAM_BYTES = 64 * 2**20  # each program's own span: past the 60 MB L2 even on one SM
TILE_ELEMS = 8192  # bf16 elements a tile: 16 KiB
STAGES = 3
PER_SM_ALL = 2  # programs an SM in the row of every SM
# Graph replays of two launches: a replay at 132 SMs x 2 reads 17 GB (about 4 ms).
TIMING = dataclasses.replace(tm.DEFAULT_TIMING, graph_launches=2, graph_reps=7)


@triton.jit
def stream_read_kernel(x_ptr, out_ptr, tiles, TILE: tl.constexpr, STAGES: tl.constexpr):
    """Program p sums its ``tiles`` tiles of ``TILE`` elements from ``x_ptr + p * tiles *
    TILE`` into fp32 and stores the ``TILE`` sums, so no load is dead."""
    pid = tl.program_id(0).to(tl.int64)
    base = x_ptr + pid * tiles * TILE
    offs = tl.arange(0, TILE)
    acc = tl.zeros([TILE], dtype=tl.float32)
    for i in tl.range(0, tiles, num_stages=STAGES):
        acc += tl.load(base + i * TILE + offs).to(tl.float32)
    tl.store(out_ptr + pid * TILE + offs, acc)


def sm_counts(total: int) -> list[int]:
    """The SM counts timed: powers of two up to ``total``, its three quarters and itself."""
    counts = {1 << i for i in range(total.bit_length()) if 1 << i <= total}
    return sorted(n for n in counts | {3 * total // 4, total} if n > 0)


def measure(sms: int, per_sm: int, x: torch.Tensor, out: torch.Tensor) -> dict:
    """One row: ``sms x per_sm`` programs, each reading ``PROGRAM_BYTES`` of ``x``."""
    programs = sms * per_sm
    tiles = PROGRAM_BYTES // (TILE_ELEMS * x.element_size())

    def launch(_: int) -> None:
        stream_read_kernel[(programs,)](x, out, tiles, TILE=TILE_ELEMS, STAGES=STAGES)

    tm.poison_(out)
    t = tm.bench_graph(launch, config=TIMING).median_s
    got = out[: programs * TILE_ELEMS].view(programs, TILE_ELEMS).sum(dim=1)
    want = x[: programs * tiles * TILE_ELEMS].view(programs, -1).sum(dim=1, dtype=torch.float32)
    if not torch.allclose(got, want, rtol=1e-3, atol=1e-2 * tiles):
        raise RuntimeError(f"stream_read_kernel summed wrong at {sms} SMs x {per_sm}")
    nbytes = programs * PROGRAM_BYTES
    return dict(
        sms=sms,
        per_sm=per_sm,
        bytes=nbytes,
        median_s=t,
        bytes_per_s=nbytes / t,
        sm_bytes_per_s=nbytes / t / sms,
    )


def measure_all() -> list[dict]:
    total = num_sms(torch.device("cuda"))
    programs = total * PER_SM_ALL
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.empty(programs * PROGRAM_BYTES // 2, device="cuda", dtype=torch.bfloat16)
    x.uniform_(generator=gen)
    out = torch.empty(programs * TILE_ELEMS, device="cuda", dtype=torch.float32)
    rows = [measure(n, 1, x, out) for n in sm_counts(total)]
    return rows + [measure(total, PER_SM_ALL, x, out)]


def table(rows: list[dict]) -> list[str]:
    """One line a row: SMs, programs an SM, aggregate and per-SM read rate in GB/s."""
    lines = [f"{'SMs':>5s} {'per SM':>6s} {'GB/s':>8s} {'GB/s an SM':>10s}"]
    for r in rows:
        lines.append(
            f"{r['sms']:5d} {r['per_sm']:6d} {r['bytes_per_s'] / 1e9:8.0f} "
            f"{r['sm_bytes_per_s'] / 1e9:10.1f}"
        )
    return lines


def main(argv=None) -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON document to write")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("sm_streams needs a CUDA GPU")
    copy = tm.copy_bytes_per_s()
    rows = measure_all()
    doc = dict(
        benchmark="sm_streams",
        provenance=tm.provenance(),
        copy_bytes_per_s=copy,
        program_bytes=PROGRAM_BYTES,
        tile_bytes=TILE_ELEMS * 2,
        stages=STAGES,
        timing=dataclasses.asdict(TIMING),
        rows=rows,
    )
    atomic_write(args.out, json.dumps(doc, indent=1) + "\n")
    print(f"copy {copy / 1e9:.0f} GB/s (read + write)")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
