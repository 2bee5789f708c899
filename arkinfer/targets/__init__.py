"""Device target profiles: `targets/<id>.toml` read into frozen, validated `Target` objects.

Profiles are data (schema: targets/README.md). Every roofline number is a `Quantity` with its
provenance; a `derived` number carries its arithmetic as an expression ("9600e6 * 64 / 8") that the
loader evaluates and compares with the value, so a derivation cannot drift from its number.
Every problem in a file raises one `TargetError` naming the file, the table, the bad value and
what is allowed.
"""

from __future__ import annotations

import difflib
import functools
from importlib import resources
from pathlib import Path

from arkinfer.errors import TargetError
from arkinfer.paths import read_limited_text
from arkinfer.targets import model
from arkinfer.targets.model import *  # noqa: F403 - the profile types, re-exported
from arkinfer.targets.model import PROFILES_PACKAGE
from arkinfer.targets.schema import parse_profile, evaluate_derivation

__all__ = [*model.__all__,  # noqa: F405
           "evaluate_derivation", "index_targets", "known_quant_formats", "list_targets", "load_target",
           "load_target_file", "resolve_id"]


#: A profile is a few KiB of TOML; anything over this is not one (/dev/zero, a log file).
PROFILE_MAX_BYTES = 1 << 20


def known_quant_formats() -> tuple[str, ...]:
    """Every quant format name a profile may list: the storage-format registry's names."""
    from arkinfer.quant.formats import all_formats

    return tuple(f.name for f in all_formats())


def load_target_file(path: str | Path) -> Target:
    """Load and validate a profile from a file of your own (same schema as the shipped ones)."""
    p = Path(path)
    text = read_limited_text(p, "target profile", PROFILE_MAX_BYTES, TargetError)
    return parse_profile(text, str(p), str(p.resolve()))


def index_targets(targets: list[Target]) -> dict[str, str]:
    """Map every id and alias to its id; TargetError when two profiles claim one name."""
    names: dict[str, str] = {}
    by_id = {t.id: t for t in targets}
    for t in targets:
        for name in (t.id, *t.aliases):
            if name in names:
                owner = by_id[names[name]]
                raise TargetError(
                    f"{t.path or t.id}: name '{name}' is already taken by target '{owner.id}' "
                    f"({owner.path or owner.id})", hint="give every id and alias to one profile")
            names[name] = t.id
    return names


@functools.lru_cache(maxsize=1)
def _registry() -> tuple[dict[str, Target], dict[str, str]]:
    targets = []
    for entry in resources.files(PROFILES_PACKAGE).iterdir():
        if not entry.name.endswith(".toml"):
            continue
        where = f"targets/{entry.name}"
        t = parse_profile(entry.read_text(encoding="utf-8"), where, where)
        if t.id != entry.name.removesuffix(".toml"):
            raise TargetError(f"{where}: id = '{t.id}' does not match the file name",
                              hint=f"rename the file to {t.id}.toml or fix the id")
        targets.append(t)
    targets.sort(key=lambda t: t.id)
    return {t.id: t for t in targets}, index_targets(targets)


def list_targets() -> list[Target]:
    """Every shipped profile, sorted by id (each one validated)."""
    return list(_registry()[0].values())


def _known() -> str:
    return ", ".join(f"{t.id} ({', '.join(t.aliases)})" if t.aliases else t.id
                     for t in list_targets())


def resolve_id(name: str) -> str:
    """The id a target name or alias stands for; TargetError listing the known ones otherwise."""
    names = _registry()[1]
    key = name.strip().lower()
    if key in names:
        return names[key]
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
    hint = (f"did you mean '{close[0]}'? " if close else "") + \
        "`arkinfer targets` lists them; a path to your own .toml profile also works"
    raise TargetError(f"unknown target '{name}'; known: {_known()}", hint=hint)


def load_target(id_or_alias: str) -> Target:
    """A shipped profile by id or alias, or a user profile by path (`*.toml`)."""
    if id_or_alias.endswith(".toml") or "/" in id_or_alias or "\\" in id_or_alias:
        return load_target_file(id_or_alias)
    return _registry()[0][resolve_id(id_or_alias)]
