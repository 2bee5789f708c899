"""The golden IR of the demo model, committed under tests/golden/ and checked by tests/ir.

    tests/golden/demo_ir.txt       the traced program (prefill + decode), as `print_ir` prints it
    tests/golden/demo_ir_opt.txt   the same after the default passes

Regenerate after an intended change to the IR, the lowering, the printer or the demo config:

    .venv/bin/python -m arkinfer.testing.golden --update

and review the diff like code. Without --update the command checks and exits 1 on a mismatch.
The dump depends only on the demo model's config (shape-only trace): arkinfer/demo/config.json
when the demo model is present, else CONFIG in examples/demo_model/train_demo_model.py.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from arkinfer.ir.passes import run_passes
from arkinfer.ir.printer import print_ir
from arkinfer.ir.tracing import trace

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_DIR = ROOT / "tests" / "golden"
UPDATE_COMMAND = ".venv/bin/python -m arkinfer.testing.golden --update"


def demo_config() -> dict[str, Any]:
    """The demo model's config.json dict (shipped copy first, else the trainer's CONFIG)."""
    shipped = ROOT / "arkinfer" / "demo" / "config.json"
    if shipped.exists():
        return json.loads(shipped.read_text(encoding="utf-8"))
    script = ROOT / "examples" / "demo_model" / "train_demo_model.py"
    spec = importlib.util.spec_from_file_location("_arkinfer_demo_trainer", script)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return dict(module.CONFIG)


def render() -> dict[str, str]:
    """File name -> expected text of every golden dump."""
    program = trace(demo_config())
    return {"demo_ir.txt": print_ir(program), "demo_ir_opt.txt": print_ir(run_passes(program))}


def mismatches(rendered: dict[str, str] | None = None) -> list[str]:
    """A unified diff per golden file that differs from what the code produces now."""
    out = []
    for name, text in (rendered or render()).items():
        path = GOLDEN_DIR / name
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old != text:
            diff = difflib.unified_diff(old.splitlines(), text.splitlines(), f"golden/{name}",
                                        "now", lineterm="", n=1)
            out.append("\n".join(list(diff)[:60]))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rendered = render()
    if "--update" in argv:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.items():
            (GOLDEN_DIR / name).write_text(text, encoding="utf-8")
            print(f"wrote {GOLDEN_DIR / name}")
        return 0
    diffs = mismatches(rendered)
    for d in diffs:
        print(d)
    if diffs:
        print(f"golden IR differs; if the change is intended run: {UPDATE_COMMAND}")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
