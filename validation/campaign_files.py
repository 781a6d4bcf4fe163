"""A campaign folder W as one file, and its products installed into the tree.

``pack`` writes W as one .tar.gz (a device run brings back a few files of at most 16 MiB),
``unpack`` restores it on a fresh machine, ``install`` copies every stage's products into their
committed places once every stage is done. W's logs and state stay in W (and its pack): they
are the campaign's working record, not data of record.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from ssvkit.perfmodel.files import atomic_write
from ssvkit.validation.campaign import CampaignError, install_files, load_state


def pack(work: Path, dest: Path) -> int:
    """W as one .tar.gz at ``dest`` (whole or not at all); returns its size in bytes."""
    if not (work / "state.json").is_file():
        raise CampaignError(f"nothing to pack: {work} has no state.json")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in sorted(work.rglob("*")):
            if p.is_file() and not p.name.startswith("."):
                tar.add(p, arcname=str(p.relative_to(work)), recursive=False)
    atomic_write(dest, buf.getvalue())
    return len(buf.getvalue())


def unpack(src: Path, work: Path) -> bool:
    """Restore W from a pack unless W holds a state as new (returns whether it unpacked);
    refuses a pack of another commit than W's state and members outside W."""
    try:
        tar = tarfile.open(src, mode="r:gz")
    except (OSError, tarfile.TarError) as e:
        raise CampaignError(f"--unpack {src}: not a campaign pack ({e})") from None
    with tar:
        names = tar.getnames()
        bad = [n for n in names if n.startswith("/") or ".." in Path(n).parts]
        if bad or "state.json" not in names:
            raise CampaignError(f"--unpack {src}: not a campaign pack ({(bad or names)[:1]})")
        theirs = json.loads(tar.extractfile("state.json").read())
        if (work / "state.json").exists():
            mine = load_state(work, ())
            if mine["commit"] != theirs["commit"]:
                raise CampaignError(
                    f"--unpack {src}: the pack is commit {theirs['commit']}, {work} holds "
                    f"commit {mine['commit']}: give --restart to discard {work}"
                )
            if mine["num_calls"] >= theirs["num_calls"]:
                return False
        work.mkdir(parents=True, exist_ok=True)
        tar.extractall(work, filter="data")
    return True


def install(stages, work: Path, root: Path) -> list[Path]:
    """Copy every stage's products into the tree; refuses unless every stage is done. Returns
    the files written."""
    if not (work / "state.json").exists():
        raise CampaignError(f"nothing to install: {work} has no state.json")
    state = load_state(work, stages)
    undone = [
        f"{s.name} ({state['stages'][s.name]['status']})"
        for s in stages
        if state["stages"][s.name]["status"] != "done"
    ]
    if undone:
        raise CampaignError(f"not every stage is done: {', '.join(undone)}; run the campaign first")
    everything = [i for s in stages for i in s.installs]
    missing = [src for src, _ in everything if not (work / src).is_file()]
    if missing:
        raise CampaignError(f"{work / missing[0]} is missing: nothing installed")
    return install_files(everything, work, root)
