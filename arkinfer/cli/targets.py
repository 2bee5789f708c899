"""`arkinfer targets` — list the device profiles, or show one with every number's provenance."""

from __future__ import annotations

from typing import Annotated

import typer

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import JsonOpt
from arkinfer.cli._output import console, print_json, print_kv, print_table
from arkinfer.targets import Quantity, Target, list_targets, load_target

HELP = ("List the device targets (id, aliases, memory, bandwidth, compute, backends), or show one "
        "profile with every number and where it comes from (vendor, derived, measured, assumed).")
EXAMPLES = [
    "arkinfer targets",
    "arkinfer targets --json",
    "arkinfer targets show jetson-orin",
    "arkinfer targets show rpi5 --json",
    "arkinfer targets show ./my-board.toml",
]

app = typer.Typer(help=HELP, invoke_without_command=True, no_args_is_help=False,
                  add_completion=False, rich_markup_mode="markdown")


def _bytes(q: Quantity | None) -> str:
    if q is None:
        return "measured at runtime"
    v = q.value
    return f"{v / 2**30:g} GiB" if v % 2**30 == 0 else f"{v / 1e9:.3g} GB"


def _rate(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def _compute_unit(key: str) -> str:
    return "OP/s" if "int8" in key else "FLOP/s"


def _peak(t: Target) -> str:
    q = t.peak_compute
    if q is None:
        return "measured at runtime" if t.measured_at_runtime else "unknown"
    return f"{_rate(q.value, _compute_unit(t.roofline or ''))} ({t.roofline})"


def _numbers(t: Target) -> list[tuple[str, str, Quantity]]:
    """(name, formatted value, quantity) for every number in the profile."""
    rows: list[tuple[str, str, Quantity]] = []
    if t.memory:
        rows.append(("memory", _bytes(t.memory), t.memory))
    for name, q in (("bandwidth (peak)", t.bandwidth), ("bandwidth (sustained)",
                                                        t.sustained_bandwidth)):
        if q:
            rows.append((name, _rate(q.value, "B/s"), q))
    for key, q in t.compute.items():
        label = f"compute {key}" + (" [roofline]" if key == t.roofline else "")
        rows.append((label, _rate(q.value, _compute_unit(key)), q))
    for name, q in (("η_bw (decode bandwidth efficiency)", t.eta_bw),
                    ("η_c (prefill compute efficiency)", t.eta_c)):
        if q:
            rows.append((name, f"{q.value:g}", q))
    return rows


@app.callback()
@handle_errors
def list_command(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """List every target profile (runs when no sub-command is given)."""
    if ctx.invoked_subcommand is not None:
        return
    targets = list_targets()
    if json_out:
        print_json([t.to_dict() for t in targets])
        return
    rows = [[t.id, ", ".join(t.aliases) or "-", _bytes(t.memory),
             _rate(t.bandwidth.value, "B/s") if t.bandwidth else "measured at runtime",
             _peak(t), t.default_backend,
             ", ".join(b for b in t.backends if b != t.default_backend) or "-"]
            for t in targets]
    print_table("ArkInfer targets", ["id", "aliases", "memory", "bandwidth", "compute",
                                     "default backend", "also"], rows)
    console.print("`arkinfer targets show ID` prints one profile with the provenance of every "
                  "number.")


@app.command("show")
@handle_errors
def show_command(
    target: Annotated[str, typer.Argument(help="Target id, alias, or path to your own .toml.")],
    json_out: JsonOpt = False,
) -> None:
    """Show one target profile: capabilities, codegen limits, every number with its provenance."""
    t = load_target(target)
    if json_out:
        print_json(t.to_dict())
        return
    print_kv(f"{t.name} — {t.id}", [
        ("aliases", ", ".join(t.aliases) or "-"),
        ("vendor", t.vendor),
        ("default backend", t.default_backend),
        ("dtypes", ", ".join(str(d) for d in t.dtypes)),
        ("memory", f"{_bytes(t.memory)}"
                   + (f", {t.memory_kind}" if t.memory_kind else "")
                   + (", unified (CPU and GPU share it)" if t.unified_memory else "")),
        *[("note", n) for n in t.notes],
        ("file", t.path),
    ])
    print_table("backends", ["backend", "quant formats", "dtypes", "note"],
                [[b.name + (" (default)" if b.name == t.default_backend else ""),
                  ", ".join(b.quant_formats) or "none (unquantised only)",
                  ", ".join(str(d) for d in b.dtypes), b.note or ""]
                 for b in t.backends.values()])
    rows = [[name, value, str(q.provenance), q.derivation or q.measurement or "", q.source]
            for name, value, q in _numbers(t)]
    if rows:
        print_table("numbers", ["quantity", "value", "provenance", "derivation / measurement",
                                "source"], rows)
    if t.measured_at_runtime and t.memory is None:
        console.print("memory, bandwidth and compute are measured on this machine: run "
                      "`arkinfer doctor`.")
    elif not t.compute:
        console.print("no compute peak is known for this device, so only decode (bandwidth-bound) "
                      "is predicted; `arkinfer bench` on the device measures prefill.")
    cg = t.codegen.to_dict()
    source = cg.pop("source", None)
    print_kv("codegen", [(k, ", ".join(v) if isinstance(v, list) else v) for k, v in cg.items()]
             + ([("source", source)] if source else []))

