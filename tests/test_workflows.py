"""The GitHub Actions files: valid against the published workflow / action schemas (the
`check-jsonschema` package's vendored copies, no network), and wired the way the README says:
tags and manual dispatch, one job per cell from `arkinfer matrix --list --json`, uploads named
MODEL-TARGET-PRESET with a retention, device jobs only on self-hosted runners when a variable
enables them, a merge job with the job summary and the release, and tests.yml running the
README's test command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
ACTION = REPO / ".github" / "actions" / "setup-arkinfer" / "action.yml"


def load(path: Path) -> dict:
    from ruamel.yaml import YAML  # YAML 1.2: `on:` stays a string key (PyYAML reads True)

    return YAML(typ="safe").load(path.read_text(encoding="utf-8"))


def check_jsonschema(schema: str, *files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema,
                           *map(str, files)], capture_output=True, text=True, timeout=120)


def test_workflows_match_the_github_workflow_schema():
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert [f.name for f in files] == ["artifacts.yml", "tests.yml"]
    result = check_jsonschema("vendor.github-workflows", *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_composite_action_matches_the_github_action_schema():
    result = check_jsonschema("vendor.github-actions", ACTION)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_catches_a_broken_workflow(tmp_path):
    """The check has teeth: a job without runs-on and an unknown trigger are rejected."""
    broken = tmp_path / "broken.yml"
    broken.write_text("on: {tagz: {}}\njobs:\n  a:\n    steps: [{run: echo}]\n")
    assert check_jsonschema("vendor.github-workflows", broken).returncode != 0


def test_artifacts_workflow_fans_out_over_the_matrix_table():
    wf = load(WORKFLOWS / "artifacts.yml")
    assert wf["on"]["push"]["tags"] == ["v*"]
    assert set(wf["on"]["workflow_dispatch"]["inputs"]) == {"model", "targets", "presets"}
    jobs = wf["jobs"]
    assert list(jobs) == ["plan", "cell", "device", "merge"]
    plan_run = "\n".join(s.get("run", "") for s in jobs["plan"]["steps"])
    assert "arkinfer matrix" in plan_run and "--list --json" in plan_run
    cell = jobs["cell"]
    assert cell["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.hosted) }}"
    assert cell["strategy"]["fail-fast"] is False
    assert cell["runs-on"].startswith("ubuntu")
    run = next(s["run"] for s in cell["steps"] if "run" in s)
    assert 'arkinfer matrix "$MODEL_PATH" --targets "$CELL_TARGET" --quant "$CELL_PRESET"' in run
    upload = next(s for s in cell["steps"] if s.get("uses", "").startswith(
        "actions/upload-artifact@"))
    assert upload["with"]["name"] == (
        "${{ needs.plan.outputs.model_name }}-${{ matrix.target }}-${{ matrix.preset }}")
    assert upload["with"]["retention-days"] > 0
    device = jobs["device"]
    assert device["runs-on"] == "${{ matrix.labels }}"
    assert "vars.ARKINFER_DEVICE_JOBS == 'true'" in device["if"]
    assert "--reverify --rebench" in next(s["run"] for s in device["steps"] if "run" in s)
    merge = jobs["merge"]
    merge_run = "\n".join(s.get("run", "") for s in merge["steps"])
    assert "arkinfer matrix --merge cells -o dist" in merge_run
    assert "GITHUB_STEP_SUMMARY" in merge_run and "gh release upload" in merge_run
    assert merge["permissions"] == {"contents": "write"} and wf["permissions"] == {
        "contents": "read"}


def test_setup_installs_pinned_versions_with_a_pip_cache():
    action = load(ACTION)
    steps = action["runs"]["steps"]
    setup = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python@"))
    assert setup["with"]["cache"] == "pip" and setup["with"]["python-version"] == "3.11"
    install = next(s["run"] for s in steps if "pip install" in s.get("run", ""))
    assert "-c constraints.txt" in install


def test_tests_workflow_runs_the_readme_test_command():
    wf = load(WORKFLOWS / "tests.yml")
    runs = [s["run"] for s in wf["jobs"]["tests"]["steps"] if "run" in s]
    assert runs == ["make test"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "make test" in readme and "make test" in (REPO / ".ci" / "run").read_text()


@pytest.fixture(scope="module")
def listed(tmp_path_factory) -> dict:
    """What the plan job gets from the command it runs (the real CLI app, in this process)."""
    import os

    from typer.testing import CliRunner

    from arkinfer.cli.main import app

    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("plan"))
    try:
        result = CliRunner().invoke(app, ["matrix", "demo", "--targets", "all", "--quant",
                                          "default", "--list", "--json"])
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_plan_output_is_the_matrix_the_jobs_expect(listed):
    from arkinfer.matrix.table import select_cells

    names = [c.name for c in select_cells("all", "default")]
    hosted = listed["github"]["hosted"]["include"]
    assert [h["name"] for h in hosted] == names  # one hosted job per cell of the table
    assert all(set(h) == {"name", "target", "preset"} for h in hosted)
    device = listed["github"]["device"]["include"]
    assert listed["github"]["device_count"] == len(device)
    for d in device:
        assert d["labels"] == ["self-hosted", d["target"]]
    assert listed["model"] == "demo"
