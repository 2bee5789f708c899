"""The matrix table: which (target, preset) cells to build.

The table itself is data in the target profiles (`[matrix]` in targets/*.toml, parsed into
`Target.matrix` by arkinfer/targets/schema.py). This module only selects from it:

    select_cells("all", "default")               # every target, the presets its table ships
    select_cells("host,jetson-orin", "q4_0,f16")  # those targets x those --quant values
"""

from __future__ import annotations

from dataclasses import dataclass

from arkinfer.errors import ArkError

DEFAULT = "default"  # --quant default: each target's own [matrix] presets
ALL = "all"  # --targets all: every shipped profile


@dataclass(frozen=True)
class Cell:
    """One artifact to build: `target` is the profile id, `target_arg` what `-t` gets (the id,
    or the path of a user's own profile), `preset` a `--quant` value, `device_labels` the
    self-hosted runner labels of the device (empty: no on-device job)."""

    target: str
    preset: str
    target_arg: str
    device_labels: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """`TARGET.PRESET`: the artifact folder's name and the cell's key in index.json."""
        return f"{self.target}.{self.preset}"


def _split(text: str, flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ArkError(f"{flag} {text!r} names nothing",
                       hint=f"e.g. {flag} {'all' if flag == '--targets' else 'default'}")
    return list(dict.fromkeys(items))


def _check_quant(name: str) -> str:
    """`name` lower-cased with aliases resolved (fp16 -> f16); ArkError for an unknown one."""
    from arkinfer.resolve import ALIASES, quant_names

    q = ALIASES.get(name.lower(), name.lower())
    if q not in quant_names():
        raise ArkError(f"unknown --quant {name!r}; known: default, {', '.join(quant_names())}",
                       hint="`default` builds the presets each target's [matrix] table ships")
    return q


def select_cells(targets: str = ALL, quant: str = DEFAULT) -> list[Cell]:
    """Cells for `--targets` (comma list of ids, aliases or .toml paths, or `all`) and `--quant`
    (comma list, or `default` = each target's [matrix] presets), target by target in the order
    given (`all`: sorted by id). ArkError for an unknown name or when nothing is selected."""
    from arkinfer.targets import list_targets, load_target

    names = _split(targets, "--targets")
    if names == [ALL]:
        profiles = [(t, t.id) for t in list_targets()]
    elif ALL in names:
        raise ArkError(f"--targets {targets!r} mixes 'all' with target names",
                       hint="pass --targets all, or only target names")
    else:
        profiles = [(load_target(n), n) for n in names]
    quants = _split(quant, "--quant")
    if DEFAULT in quants and len(quants) > 1:
        raise ArkError(f"--quant {quant!r} mixes 'default' with presets",
                       hint="pass --quant default, or only presets")
    explicit = None if quants == [DEFAULT] else [_check_quant(q) for q in quants]
    cells: dict[str, Cell] = {}
    for target, arg in profiles:
        for preset in explicit if explicit is not None else target.matrix.presets:
            cell = Cell(target.id, preset, arg, target.matrix.device_labels)
            cells.setdefault(cell.name, cell)
    if not cells:
        raise ArkError(f"no cells: the [matrix] table of {', '.join(t.id for t, _ in profiles)} "
                       "lists no presets", hint="name presets with --quant, e.g. --quant q4_0, "
                       "or add presets = [...] to the profile's [matrix] table")
    return list(cells.values())
