"""The tokenizer and chat-template files a model folder or an artifact carries, and their copy.

    copy_tokenizer_files(source_dir, out_dir)          -> ["tokenizer.json", ...] (those copied)
    copy_tokenizer_files(source_dir, out_dir, ("config.json", *TOKENIZER_FILES))
    tokenizer_dir(request.model_dir, request.source_dir)   -> the folder to copy them from

One list for every writer (quantised folders, the float reference folders, every backend's
artifact): the Hugging Face fast tokenizer (tokenizer.json) and its config, the slow tokenizers'
files (SentencePiece tokenizer.model, BPE vocab.json + merges.txt, added_tokens.json), the
special-token map, the chat template and generation_config.json (eos ids, sampling defaults).
A file the source does not hold is skipped, so a superset costs nothing.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                   "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "added_tokens.json", "chat_template.jinja")


def copy_tokenizer_files(source_dir: str | Path, out_dir: str | Path,
                         names: Iterable[str] = TOKENIZER_FILES) -> list[str]:
    """Copy each of `names` that `source_dir` holds as a regular file into `out_dir` (metadata
    kept, an existing file replaced); returns the names copied, in the order of `names`."""
    src, out = Path(source_dir), Path(out_dir)
    copied = []
    for name in names:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
            copied.append(name)
    return copied


def tokenizer_dir(model_dir: str | Path, source_dir: str | Path) -> Path:
    """The folder an artifact takes its tokenizer from: the folder it was lowered from when that
    holds tokenizer.json (a quantised folder carries its source's), else the float source."""
    return Path(model_dir) if (Path(model_dir) / "tokenizer.json").is_file() else Path(source_dir)
