"""`arkinfer verify` — check an artifact's manifest, hashes and parity with its float source."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import JsonOpt
from arkinfer.cli._output import err_console, print_json, print_kv, print_table, terminal_safe

HELP = ("Verify an artifact: the manifest against its JSON schema, the sha256 of every file, then "
        "its Runner on this machine against the float reference model on fixed prompts (top-1 "
        "agreement, mean KL divergence, perplexity delta), re-measured every time. Thresholds are "
        "the quant scheme's unless overridden with --threshold; the thresholds and metrics the "
        "manifest records are never trusted (the report says where the recorded metrics differ "
        "from the re-measured ones). Exits non-zero naming the metric when a threshold is crossed "
        "or a file was changed.")
EXAMPLES = [
    "arkinfer verify dist/demo.host.q4_0",
    "arkinfer verify dist/smollm2.host.q4_0 --threshold ppl_delta=0.5 --json",
    "arkinfer verify ./artifact --source ./SmolLM2-135M-Instruct-hf",
]


@handle_errors
def command(
    artifact: Annotated[Path, typer.Argument(help="Artifact folder written by `arkinfer build`.")],
    threshold: Annotated[list[str] | None, typer.Option(
        "--threshold", help="Override a threshold: top1=, kl= or ppl_delta= (repeatable).")
    ] = None,
    source: Annotated[Path | None, typer.Option(
        "--source", help="The float checkpoint (default: the path in the manifest).")] = None,
    json_out: JsonOpt = False,
) -> None:
    from arkinfer.pipeline.artifact import verify_artifact
    from arkinfer.pipeline.verify import VerifyError, parse_threshold_overrides

    overrides = parse_threshold_overrides(threshold)
    if json_out:
        result = verify_artifact(artifact, overrides=overrides, source=source)
    else:
        with err_console.status(Text("verifying")) as status:
            result = verify_artifact(
                artifact, overrides=overrides, source=source,
                step=lambda m: status.update(Text(terminal_safe(f"verifying: {m}"))))
    if json_out:
        print_json(result)
    else:
        m, t = result["metrics"], result["thresholds"]
        print_table(f"verify {artifact}", ["metric", "value", "threshold"], [
            ["top1_agreement", f"{m['top1_agreement']:.4f}", f">= {t['top1']}"],
            ["mean_kl", f"{m['mean_kl']:.5f}", f"<= {t['kl']}"],
            ["ppl_delta", (f"{m['ppl_delta']:+.2%} ({m['ppl_reference']:.3f} -> "
                          f"{m['ppl_artifact']:.3f})"), f"<= {t['ppl_delta']:+.0%}"],
            ["max_abs_logit_diff", f"{m['max_abs_logit_diff']:.4g}", "(reported)"],
            ["tokenizer_agreement", f"{m['tokenizer_agreement']:.2f}", "= 1.0"],
            ["attention", "dense (the float model run dense, as this runtime runs it)"
             if m.get("attention") == "dense" else "as the model's config says", "(reported)"],
        ])
        if "fidelity" in result:
            f = result["fidelity"]
            print_table(f"runtime vs the reference model on the same quantised weights "
                        f"({f['reference_weights']})", ["metric", "value", "threshold"], [
                            ["top1_agreement", f"{f['top1_agreement']:.4f}",
                             f">= {f['threshold_top1']}"],
                            ["mean_kl", f"{f['mean_kl']:.6f}", "(reported)"],
                            ["max_abs_logit_diff", f"{f['max_abs_logit_diff']:.4g}", "(reported)"]])
        print_kv("integrity", [("files", result["integrity"]), ("float source", (
            f"{result['source']['path']} (chosen by {result['source']['chosen_by']})")),
            ("speculative decoding", _speculative_line(result.get("speculative")))])
        _print_manifest_differences(result)
        for line in result.get("deferred", []):
            err_console.print(terminal_safe(f"note: not verified here: {line}"))
    if not result["passed"]:
        raise VerifyError(f"{artifact} failed verification: " + "; ".join(result["failures"]),
                          hint="rebuild with a more precise --quant, or pass --threshold to "
                          "loosen the gate explicitly")
    if not json_out:
        err_console.print("[green]passed[/]", markup=True)


def _speculative_line(check: dict | None) -> str:
    """One line for verify's speculative check (pipeline/verify_speculative.py)."""
    if not check:
        return "not checked"
    if not check.get("checked"):
        return f"not checked: {check.get('reason', '')}"
    ties = check.get("near_ties", [])
    verdict = ("identical to plain greedy" if check.get("identical") else
               "DIFFERS from plain" if "failure" in check else
               f"identical to plain greedy but for {len(ties)} near tie(s) the runtime's batched "
               "and single-token kernels order differently")
    return (f"{verdict} ({check['draft']}, k={check['k']}, {check.get('tokens', 0)} tokens over "
            f"{check['prompts']} prompts, mean accepted length "
            f"{check.get('mean_accepted_length', 0):.2f})")


def _print_manifest_differences(result: dict) -> None:
    """What the manifest claims that this run did not use or did not reproduce."""
    mismatches = result["recorded_mismatches"]
    if mismatches:
        err_console.print(f"warning: {len(mismatches)} metric(s) recorded in the manifest differ "
                          "from the re-measured ones (the gate uses the re-measured values)")
        print_table("recorded in the manifest vs re-measured", ["metric", "recorded", "measured"],
                    [[m["metric"], m["recorded"], m["measured"]] for m in mismatches])
    ignored = result.get("manifest_thresholds_ignored")
    if ignored is not None:
        err_console.print(terminal_safe(
            f"note: the manifest records the thresholds {ignored}; verify applies the scheme's "
            f"{result['thresholds']} (pass --threshold to change them)"))
