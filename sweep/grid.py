"""Building a ``SweepSpec`` from a dict of grid keys: a YAML/JSON grid file (``load_grid``; YAML
needs the ``sweep`` extra, JSON works on the base install), command-line flags, or both merged
(flags win). ``spec_from_doc`` shows a grid file with its keys.

Every value is checked on construction; errors name the file, the key and the bad value.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from ssvkit.perfmodel.files import loads_json, read_text
from ssvkit.perfmodel.hardware import suggest
from ssvkit.perfmodel.numbers import MAX_COUNT, finite_float, parse_count
from ssvkit.perfmodel.strategy import BASELINES, DrafterSpec, Strategy
from ssvkit.sweep.spec import (
    AXES,
    CapacitySpec,
    SimulateSpec,
    SweepSpec,
    SweepStrategy,
    default_strategies,
)

# Strategy fields `vary` may take, and which strategies each applies to.
SPECULATIVE_FIELDS = ("tree", "traversal")
SPARSE_FIELDS = ("top_n", "block_size", "window", "comp_block", "comp_stride", "metadata")
GROUPING_FIELDS = ("mode", "group_size", "refresh_every", "fusion")
VARY_FIELDS = SPECULATIVE_FIELDS + SPARSE_FIELDS + GROUPING_FIELDS

KEYS = (
    "models",
    "gpus",
    *AXES,
    "strategies",
    "vary",
    "roofline",
    "any_architecture",
    "simulate",
    "capacity",
)
ALIASES = {"model": "models", "gpu": "gpus", "context": "context_len"}
SUBSPECS = {"simulate": SimulateSpec, "capacity": CapacitySpec}


def load_grid(path: str | Path) -> dict:
    """Parse a YAML or JSON grid file into a dict (validated by ``spec_from_doc``)."""
    p = Path(path)
    text = read_text(p, "grid file")
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(
                f"reading {p.name} needs PyYAML: pip install 'ssvkit[sweep]' (or use a .json grid)"
            ) from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ValueError(
                f"{p.name}: not valid YAML{where}: {getattr(e, 'problem', e)}"
            ) from None
    elif p.suffix.lower() == ".json":
        doc = loads_json(text, "grid file", path, kind=None)
    else:
        raise ValueError(f"grid file {p.name!r} must end in .yaml, .yml or .json")
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ValueError(f"{p.name}: the grid must be a mapping of keys to values")
    return doc


def spec_from_doc(doc: dict, where: str = "grid") -> SweepSpec:
    """A ``SweepSpec`` from a dict of grid keys (file contents, flags, or both merged).

    Scalars count as one-element lists; context lengths take K/M suffixes; errors are one line
    that starts with ``where``.

    Examples
    --------
    A grid file::

        models: [llama-3.1-8b, qwen3-8b]
        gpus: [h100-sxm, h200]
        tp: [1, 2]
        context_len: [8K, 32K, 128K]          # K = 1024, as on the command line
        batch: [1, 8, 32]
        acceptance: [0.6, 0.7, 0.8]
        strategies: [ar_dense, sd_dense, ssv, {name: ssv-c8, base: ssv, group_size: 8}]
        vary: {top_n: [16, 32]}               # a copy of each strategy the field applies to
        simulate: {num_tokens: 256}           # a DES run per point (small grids)
        capacity: {rates: [10, 50], slo_tpot_s: 0.05}
    """
    try:
        return _spec_from_doc(doc)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _spec_from_doc(doc: dict) -> SweepSpec:
    kw: dict = {}
    for key, value in doc.items():
        name = ALIASES.get(key, key)
        if name not in KEYS:
            raise ValueError(f"unknown key {key!r}{suggest(str(key), list(KEYS))}")
        if name in kw:
            raise ValueError(f"{key!r} is given twice (as {name!r} and an alias)")
        kw[name] = value
    out: dict = {}
    for name in ("models", "gpus"):
        if name in kw:
            out[name] = tuple(str(v) for v in _list(name, kw[name]))
    for name in ("tp", "batch", "kv_bytes", "context_len"):
        if name in kw:
            out[name] = tuple(_int(f"{name}[{i}]", v) for i, v in enumerate(_list(name, kw[name])))
    for name in ("acceptance", "overlap"):
        if name in kw:
            out[name] = tuple(
                _float(f"{name}[{i}]", v) for i, v in enumerate(_list(name, kw[name]))
            )
    for name in ("roofline", "any_architecture"):
        if name in kw:
            if not isinstance(kw[name], bool):
                raise ValueError(f"{name} must be true or false, got {kw[name]!r}")
            out[name] = kw[name]
    strategies = (
        [_strategy(i, s) for i, s in enumerate(_list("strategies", kw["strategies"]))]
        if ("strategies" in kw)
        else list(default_strategies())
    )
    vary = kw.get("vary") or {}
    if not isinstance(vary, dict):
        raise ValueError("vary must map strategy fields to lists of values")
    out["strategies"] = tuple(expand(strategies, vary))
    for name, cls in SUBSPECS.items():
        if name in kw and kw[name] is not False:
            out[name] = _subspec(name, cls, kw[name])
    return SweepSpec(**out)


def _list(name: str, value) -> list:
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError(f"{name} needs at least one value")
        return list(value)
    if isinstance(value, str) and "," in value:
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, dict):
        raise ValueError(f"{name} must be a value or a list, got a mapping")
    return [value]


def _int(where: str, v) -> int:
    return parse_count(v, where, minimum=-MAX_COUNT)


def _float(where: str, v) -> float:
    return finite_float(v, where)


STRATEGY_FIELDS = {f.name: f for f in dataclasses.fields(Strategy)}
DRAFTER_FIELDS = {f.name: f for f in dataclasses.fields(DrafterSpec)}


def _typed(where: str, f: dataclasses.Field, v):
    """A field value converted to the type of its default (int, float, str)."""
    default = f.default if f.default is not dataclasses.MISSING else None
    if isinstance(default, bool):
        if not isinstance(v, bool):
            raise ValueError(f"{where}: {v!r} is not true or false")
        return v
    if isinstance(default, int):
        return _int(where, v)
    if isinstance(default, float):
        return _float(where, v)
    if v is None or isinstance(v, list | dict):
        raise ValueError(f"{where}: {v!r} is not a single value")
    return str(v)


def _strategy(i: int, item) -> SweepStrategy:
    where = f"strategies[{i}]"
    if isinstance(item, str):
        return SweepStrategy(item, _baseline(where, item))
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a baseline name or a mapping, got {item!r}")
    item = dict(item)
    name = item.pop("name", None)
    base = item.pop("base", None)
    if base is None and name in BASELINES:
        base = name
    if base is None:
        raise ValueError(f"{where}: a custom strategy needs base: <baseline name>")
    template = _baseline(f"{where}.base", str(base))
    drafter = item.pop("drafter", None)
    kw = {}
    for k, v in item.items():
        if k not in STRATEGY_FIELDS or k in ("name", "drafter"):
            choices = [n for n in STRATEGY_FIELDS if n not in ("name",)]
            raise ValueError(f"{where}: unknown strategy field {k!r}{suggest(str(k), choices)}")
        kw[k] = _typed(f"{where}.{k}", STRATEGY_FIELDS[k], v)
    if drafter is not None:
        if not isinstance(drafter, dict):
            raise ValueError(f"{where}.drafter must be a mapping of drafter fields")
        dkw = {}
        for k, v in drafter.items():
            if k not in DRAFTER_FIELDS:
                raise ValueError(
                    f"{where}.drafter: unknown field {k!r}{suggest(str(k), list(DRAFTER_FIELDS))}"
                )
            dkw[k] = None if v is None else _typed(f"{where}.drafter.{k}", DRAFTER_FIELDS[k], v)
        try:
            kw["drafter"] = dataclasses.replace(template.drafter, **dkw)
        except ValueError as e:
            raise ValueError(f"{where}.drafter: {e}") from None
    label = str(name) if name is not None else _variant_label(str(base), kw)
    try:
        return SweepStrategy(str(base), dataclasses.replace(template, name=label, **kw))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _baseline(where: str, name: str) -> Strategy:
    if name not in BASELINES:
        raise ValueError(f"{where}: unknown strategy {name!r}{suggest(name, list(BASELINES))}")
    return BASELINES[name]


def _variant_label(label: str, changes: dict) -> str:
    shown = {k: v for k, v in changes.items() if k != "drafter"}
    if not shown:
        return label
    return f"{label}[{','.join(f'{k}={v}' for k, v in shown.items())}]"


def applies(field_name: str, s: SweepStrategy) -> bool:
    """Whether varying ``field_name`` changes strategy ``s`` (tree fields: speculative ones;
    sparse budget fields: sparse ones; grouping fields: grouped sparse ones, i.e. ``ssv`` and
    strategies whose mode is not ``per_query``)."""
    if field_name in SPECULATIVE_FIELDS:
        return s.speculative
    if field_name in SPARSE_FIELDS:
        return s.strategy.is_sparse
    return s.strategy.is_sparse and (s.base == "ssv" or s.strategy.mode != "per_query")


def expand(strategies: list[SweepStrategy], vary: dict) -> list[SweepStrategy]:
    """Each strategy times the product of the ``vary`` values of the fields that apply to it
    (``applies``); the others are kept once. Labels gain ``[field=value,...]``."""
    axes = {}
    for k, values in vary.items():
        if k not in VARY_FIELDS:
            raise ValueError(
                f"vary: unknown or fixed field {k!r}{suggest(str(k), list(VARY_FIELDS))}"
            )
        vals = [
            _typed(f"vary.{k}[{i}]", STRATEGY_FIELDS[k], v) for i, v in enumerate(_list(k, values))
        ]
        if len(set(vals)) != len(vals):
            raise ValueError(f"vary.{k} lists a value twice")
        axes[k] = vals
    if not axes:
        return strategies
    out = []
    for s in strategies:
        names = [k for k in axes if applies(k, s)]
        if not names:
            out.append(s)
            continue
        for combo in itertools.product(*(axes[k] for k in names)):
            changes = dict(zip(names, combo, strict=True))
            try:
                strat = dataclasses.replace(
                    s.strategy, name=_variant_label(s.label, changes), **changes
                )
            except ValueError as e:
                raise ValueError(f"vary on {s.label}: {e}") from None
            out.append(SweepStrategy(s.base, strat))
    return out


def _subspec(name: str, cls, value):
    if value is True or value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a mapping of {cls.__name__} fields (or true)")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw = {}
    for k, v in value.items():
        if k not in fields:
            raise ValueError(f"{name}: unknown field {k!r}{suggest(str(k), list(fields))}")
        f = fields[k]
        if isinstance(f.default, tuple):
            if v in ([], ()) and not f.default:
                kw[k] = ()
                continue
            items = _list(f"{name}.{k}", v)
            conv = _float if k == "rates" else (lambda w, x: str(x))
            kw[k] = tuple(conv(f"{name}.{k}[{i}]", x) for i, x in enumerate(items))
        else:
            kw[k] = _typed(f"{name}.{k}", f, v)
    try:
        return cls(**kw)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
