"""The printed IR of the demo model equals the committed golden files (tests/golden/demo_ir*.txt).

Regenerate after an intended change: .venv/bin/python -m arkinfer.testing.golden --update
"""

from __future__ import annotations

from arkinfer.testing import golden


def test_demo_ir_matches_golden():
    diffs = golden.mismatches()
    assert not diffs, ("the demo model's IR no longer matches tests/golden/ "
                       f"(if the change is intended, regenerate with: {golden.UPDATE_COMMAND}):\n"
                       + "\n\n".join(diffs))
