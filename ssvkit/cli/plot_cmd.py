"""``ssvkit plot``: PNGs from a saved sweep: speedup heatmaps (context x acceptance) per
baseline, Pareto fronts (latency vs throughput), a roofline with the op groups, capacity curves.

ssvkit plot sweep.csv                                  # every plot the table supports
ssvkit plot sweep.parquet --kind heatmap --baselines ar_sparse,sd_dense --batch 8
ssvkit plot cap.csv --kind capacity,pareto --out-dir figs/

PNG names start with the sweep file's name and format (``run.csv`` -> ``run-csv-pareto.png``),
led by its folder's name when they go to another folder (``a/run.csv`` -> ``a-run-csv-...``):
sweeps that share a stem or a folder name get PNGs of their own. Each PNG records the sweep it
was drawn from; one drawn from another sweep (or any other file) is never overwritten.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from urllib.parse import quote, unquote

from ssvkit.cli.options import finite, parse_one
from ssvkit.perfmodel.files import check_folder, write_files

HELP = "plot a saved sweep: speedup heatmaps, Pareto fronts, roofline, capacity curves (PNG)"
KINDS = ("heatmap", "pareto", "roofline", "capacity")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SOURCE_KEY = b"ssvkit sweep"


def add_arguments(p) -> None:
    p.add_argument("sweep", metavar="SWEEP", help="table written by ssvkit sweep --out")
    p.add_argument(
        "--kind",
        default="all",
        help=f"comma-separated plots: {', '.join(KINDS)} or all (default: all the table supports)",
    )
    p.add_argument(
        "--out-dir", metavar="DIR", help="folder for the PNGs (default: the sweep file's folder)"
    )
    p.add_argument(
        "--capacity",
        metavar="FILE",
        help="capacity table (default: SWEEP's sibling NAME.capacity.EXT when present)",
    )
    p.add_argument(
        "--baselines",
        help="heatmap baselines (default: ar_dense, ar_sparse and the sd_* ones in the sweep)",
    )
    p.add_argument("--strategies", help="heatmap panels (default: the best by median speedup)")
    g = p.add_argument_group("the axes a plot does not draw (default: the first value)")
    g.add_argument("--model")
    g.add_argument("--gpu")
    g.add_argument("--tp", type=int)
    g.add_argument("--context", help="context length, K = 1024 (roofline: default the largest)")
    g.add_argument("--batch", type=int)
    g.add_argument("--acceptance", type=finite)
    g.add_argument("--overlap", type=finite)
    g.add_argument("--kv-bytes", type=int)
    p.add_argument("--json", action="store_true", help="print the written files as JSON")


def _fixed(args) -> dict:
    out = {
        "model": args.model,
        "gpu": args.gpu,
        "tp": args.tp,
        "batch": args.batch,
        "acceptance": args.acceptance,
        "overlap": args.overlap,
        "kv_bytes": args.kv_bytes,
    }
    if args.context:
        out["context_len"] = parse_one(args.context, "--context")
    return {k: v for k, v in out.items() if v is not None}


def _names(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def png_prefix(sweep: Path, out_dir: Path) -> str:
    """``run.csv`` -> ``run-csv``; ``a/run.csv`` -> ``a-run-csv`` when ``out_dir`` is not ``a``."""
    src = sweep.resolve()
    prefix = f"{src.stem}-{src.suffix[1:]}" if src.suffix else src.name
    return prefix if out_dir.resolve() == src.parent else f"{src.parent.name}-{prefix}"


def with_source(png: bytes, source: str) -> bytes:
    """``png`` with a tEXt chunk, right after IHDR, naming the sweep it was drawn from."""
    data = SOURCE_KEY + b"\0" + quote(source).encode("ascii")
    chunk = struct.pack(">I4s", len(data), b"tEXt") + data
    chunk += struct.pack(">I", zlib.crc32(b"tEXt" + data))
    end = len(PNG_SIGNATURE) + 8 + 13 + 4  # IHDR: length, type, 13 bytes, CRC
    return png[:end] + chunk + png[end:]


def png_source(path: Path) -> str | None:
    """The sweep a PNG of ``ssvkit plot`` was drawn from; None for any other file."""
    data = path.read_bytes()
    i = len(PNG_SIGNATURE)
    while data.startswith(PNG_SIGNATURE) and i + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[i : i + 8])
        if kind == b"IDAT":
            break
        key, _, text = data[i + 8 : i + 8 + size].partition(b"\0")
        if kind == b"tEXt" and key == SOURCE_KEY:
            return unquote(text.decode("ascii", "replace"))
        i += 12 + size
    return None


def _check_overwrite(path: Path, source: str, given: str) -> None:
    if not path.exists():
        return
    owner = path.is_file() and png_source(path)
    if owner != source:
        what = f"a plot of {owner!r}" if owner else "a file ssvkit plot did not draw"
        raise ValueError(
            f"{str(path)!r} holds {what}, not of {given!r}: choose another --out-dir or remove it"
        )


def run(args) -> int:
    from ssvkit.sweep import capacity_plots, plots
    from ssvkit.sweep.table import read_table, sibling

    kinds = KINDS if args.kind == "all" else tuple(_names(args.kind) or ())
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"--kind {args.kind!r}: choose from {', '.join(KINDS)} or all")
    table, _ = read_table(args.sweep)
    required = ("strategy", "tokens_per_s", "speedup_vs_ar_dense", "tpot_s", "context_len")
    missing = [c for c in required if c not in table]
    if missing:
        raise ValueError(f"{args.sweep} is not a sweep table (no {missing[0]!r} column)")
    out_dir = Path(args.out_dir) if args.out_dir else Path(args.sweep).resolve().parent
    check_folder(out_dir, "--out-dir")
    cap_path = Path(args.capacity) if args.capacity else sibling(args.sweep, "capacity")
    if "capacity" in kinds and not cap_path.is_file():
        if args.kind != "all" or args.capacity:
            raise ValueError(
                f"no capacity table {str(cap_path)!r} (run ssvkit sweep with --capacity-rates)"
            )
        kinds = tuple(k for k in kinds if k != "capacity")
    fixed = _fixed(args)
    prefix = png_prefix(Path(args.sweep), out_dir)
    images: dict[str, bytes] = {}
    # Everything is drawn before anything is written: a bad option leaves no file behind.
    if "heatmap" in kinds:
        baselines = _names(args.baselines) or plots.heatmap_baselines(table)
        for b in baselines:
            images[f"{prefix}-heatmap-vs-{b}.png"] = plots.heatmap(
                table, b, fixed, _names(args.strategies)
            )
    if "pareto" in kinds:
        images[f"{prefix}-pareto.png"] = plots.pareto(table, fixed)
    if "roofline" in kinds:
        images[f"{prefix}-roofline.png"] = plots.roofline(table, fixed)
    if "capacity" in kinds:
        cap, _ = read_table(cap_path)
        images[f"{prefix}-capacity.png"] = capacity_plots.capacity(cap, fixed)
    source = str(Path(args.sweep).resolve())
    for name in images:
        _check_overwrite(out_dir / name, source, args.sweep)
    write_files((out_dir / n, with_source(data, source), "--out-dir") for n, data in images.items())
    paths = [str(out_dir / n) for n in images]
    print(
        json.dumps({"files": paths}, indent=1)
        if args.json
        else "\n".join(f"wrote {p}" for p in paths)
    )
    return 0
