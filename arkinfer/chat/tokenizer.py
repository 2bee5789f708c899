"""The tokenizer and chat template of a built artifact.

Looked for, in order:

1. tokenizer files the artifact carries: `tokenizer.json` (+ tokenizer_config.json,
   chat_template.jinja, generation_config.json) in the artifact folder or its `model/` (reference)
   or `hf/` (onnx) folder;
2. the vocabulary and chat template in a GGUF file's metadata (`tokenizer.ggml.*`,
   `tokenizer.chat_template`), rebuilt so `tokenizers` gives llama.cpp's ids;
3. the float source folder the manifest names, when it still exists.

Stop ids: generation_config.json's `eos_token_id` (one or a list), the eos token and
`<|im_end|>`; from a GGUF its eos and eot ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arkinfer.errors import TokenizerError
from arkinfer.frontend.tokenizer import TextTokenizer, load_tokenizer

#: Sub-folders of an artifact that may hold its Hugging Face files (reference: model/, onnx: hf/).
HF_FOLDERS = (".", "model", "hf")


def artifact_folders(path: Path) -> list[Path]:
    """The artifact folder and its Hugging Face sub-folders that exist, in search order."""
    return [path / sub for sub in HF_FOLDERS if (path / sub).is_dir()]


def _from_folder(folder: Path, vocab_size: int | None) -> TextTokenizer | None:
    from arkinfer.frontend.model_folder import read_generation_config

    generation = read_generation_config(folder, vocab_size) if vocab_size else {}
    return load_tokenizer(folder, generation, vocab_size)


def _from_gguf(gguf_path: Path) -> TextTokenizer:
    from arkinfer.frontend.gguf_reader import GGUFFile
    from arkinfer.frontend.gguf_tokenizer import build_tokenizer

    gguf = GGUFFile(gguf_path)
    files = build_tokenizer(gguf)
    config = files.tokenizer_config
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates (gguf_tokenizer.chat_templates): "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    stop = {tid for key in ("eos", "eot")
            if (tid := gguf.get_int(f"tokenizer.ggml.{key}_token_id", None)) is not None}
    im_end = files.tokenizer.token_to_id("<|im_end|>")
    if im_end is not None:
        stop.add(im_end)
    return TextTokenizer(files.tokenizer, template, config.get("bos_token"),
                         config.get("eos_token"), stop)


def _check_recorded(tokenizer_json: Path, manifest: dict[str, Any]) -> None:
    """Raise when the float source's tokenizer.json is not the one the artifact was built with
    (the manifest's `tokenizer.tokenizer_sha256`): other ids would feed the artifact garbage."""
    from arkinfer.pipeline.manifest import sha256_file

    recorded = (manifest.get("tokenizer") or {}).get("tokenizer_sha256")
    if recorded and sha256_file(tokenizer_json) != recorded:
        raise TokenizerError(f"{tokenizer_json} differs from the tokenizer the artifact was built "
                             f"with (sha256 {recorded[:12]} in its manifest)",
                             hint="put the model folder the artifact was built from back at "
                             "that path, or rebuild the artifact")


def artifact_tokenizer(path: str | Path, manifest: dict[str, Any],
                       vocab_size: int | None = None) -> tuple[TextTokenizer, str]:
    """(tokenizer, where it came from) of the artifact at `path`; `vocab_size` (the runner's)
    bounds every id it can produce. Raises TokenizerError naming the places searched."""
    path = Path(path)
    for folder in artifact_folders(path):
        tok = _from_folder(folder, vocab_size)
        if tok is not None:
            return tok, f"{folder / 'tokenizer.json'}"
    ggufs = sorted(path.glob("*.gguf"))
    if ggufs:
        return _from_gguf(ggufs[0]), f"the GGUF metadata of {ggufs[0]}"
    source = Path(manifest.get("source", {}).get("path", ""))
    if str(source) not in ("", ".") and (source / "tokenizer.json").is_file():
        _check_recorded(source / "tokenizer.json", manifest)
        tok = _from_folder(source, vocab_size)
        if tok is not None:
            return tok, f"the float source {source / 'tokenizer.json'}"
    raise TokenizerError(f"artifact {path} has no tokenizer: no tokenizer.json in "
                         f"{', '.join(str(f) for f in artifact_folders(path))}, no .gguf file, "
                         f"and its float source {source} holds none",
                         hint="rebuild the artifact from a model folder that has tokenizer.json "
                         "(arkinfer build MODEL ...), or put the model folder it was built from "
                         "back at the path its manifest names (source.path)")
