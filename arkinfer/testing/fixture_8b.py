"""8B-shaped random-weight checkpoints in the exact Hugging Face layout, for memory and time checks
of the build pipeline at real scale.

    folder = ensure_fixture("minicpm4.1-8b")            # ~16.4 GB, written once into the cache
    folder = ensure_fixture("llama-3-8b", layers=2)     # same width, 2 layers: ~3.0 GB
    python -m arkinfer.testing.fixture_8b --shape minicpm4.1-8b --layers 1

Shapes (`SHAPES`): `minicpm4.1-8b` is `KNOWN_CONFIGS["minicpm4.1-8b"]` (hidden 4096, 32 layers,
32 q / 2 kv heads of 128, FFN 16384, vocab 73448, LongRoPE, sparse_config: 8,185,253,888
parameters, 16.37 GB in bf16); `llama-3-8b` is Meta-Llama-3.1-8B's config.json (32 q / 8 kv heads,
FFN 14336, vocab 128256, rope_theta 500000, llama3 rope_scaling: 8,030,261,248 parameters,
16.06 GB). `layers` keeps the width and cuts the depth (reduced-depth fixtures for quick timing
runs); `config_overrides` changes any config key (tests use it for a ~5 MB folder).

Folder: bf16 shards `model-0000i-of-0000N.safetensors` (at most `shard_bytes` each) with
`model.safetensors.index.json` (one `model.safetensors` and no index when all fits in one
shard, as Hugging Face writes it), `config.json`, the demo model's tokenizer.json,
tokenizer_config.json, chat_template.jinja and generation_config.json, and `fixture.json`
(shape, layers, seed, total bytes), written last: a folder with it is complete.

Initial values (`init_std`), chosen so the residual stream stays O(1) over 32 layers, plus one
planted structure (`next_token_rows`) so the logits have a clear top-1, as a trained model's do:
- norms: 1 + 0.02 N(0, 1).
- q/k/v/gate/up: std 0.02 = HF's `initializer_range`. Their input is RMS-normalised, so each
  output has variance 4096 x 0.02^2 = 1.6: O(1) into softmax and SiLU.
- o_proj/down_proj: std 0.02 / (sqrt(2L) x r), r the model's residual scale (1 for Llama,
  scale_depth / sqrt(L) for MiniCPM). sqrt(2L) is GPT-2's / Megatron's scaled init: 2L updates
  of variance ~1/(2L) each sum to O(1). MiniCPM already multiplies each update by r, so dividing
  by r gives it the same update sizes as Llama (std 0.0101 for MiniCPM, 0.0025 for Llama).
- embed_tokens: RMS 1 where the model reads it (1 / scale_emb for MiniCPM, whose `embed x
  scale_emb` is then RMS 1; 1 for Llama), so the current token's direction survives the 32
  layers' updates in the last hidden state.
- lm_head: 0.02 x logit divisor (hidden / dim_model_base = 16 for MiniCPM, 1 for Llama): logits
  = lm_head(norm(h)) / divisor have std ~1.3; plus, for every token t, the unit vector of t's
  embedding row added to the row of a successor token s(t) (a seeded permutation), scaled so
  that successor's logit rises by about NEXT_TOKEN_GAIN = 10 over the others: a bigram model on
  top of random layers. Without it (version 1 of the fixture) the logits were a Gaussian cloud
  over 73,448 tokens, the top-1 / top-2 gap had a median of ~0.3, and 4-bit rounding or
  llama.cpp's 8-bit activations flipped the argmax on 7 % of verify's steps on the same weights
  (BENCHMARKS.md, "MiniCPM4.1-8B at full size").

What does not match a real checkpoint: the weights are random (no trained structure, no outlier
channels or massive activations, so quantisation error statistics differ); the tokenizer is the
demo's (2048 ids, far below vocab_size: every id it produces is a valid row, the rest of the
embedding is never used by real text); config.json's bos/eos/pad ids are the demo tokenizer's
(1, [2, 4], 2) instead of the published ones, so generation stops on the tokenizer's own <|im_end|>;
MiniCPM's 64 LongRoPE factors are the interpolated ones of `models.configs` (docs/model.md gives
only the first and last published values).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from arkinfer import models
from arkinfer.disk_space import check_free_disk
from arkinfer.errors import ArkError
from arkinfer.frontend.shard_writer import TensorSpec, plan_shards, write_shards
from arkinfer.latency.source import KNOWN_CONFIGS

Shape = Literal["minicpm4.1-8b", "llama-3-8b"]

# Meta-Llama-3.1-8B's config.json (transformers 4.43), keys the loader reads or ignores.
LLAMA_3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-5,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}
SHAPES: dict[str, dict[str, Any]] = {
    "minicpm4.1-8b": KNOWN_CONFIGS["minicpm4.1-8b"],
    "llama-3-8b": LLAMA_3_8B,
}
DEMO_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "generation_config.json")
STAMP = "fixture.json"
DTYPE = "bf16"
BASE_STD = 0.02
NEXT_TOKEN_GAIN = 10.0  # logits the planted successor token rises by (next_token_rows)
SURVIVING = 0.5         # the embedding's share of the last hidden state's norm at 32 layers
VERSION = 2             # of the weights' recipe, in fixture.json: 1 had no next_token_rows
# Room for config/tokenizer files and safetensors headers on top of the tensor bytes.
DISK_MARGIN = 64 * 2**20


class FixtureError(ArkError):
    """A fixture cannot be written (unknown shape, not enough disk)."""


@dataclass(frozen=True)
class Progress:
    """Where a write stands after one tensor: counts, bytes and seconds since the start."""

    tensors_done: int
    tensors_total: int
    shards_done: int
    shards_total: int
    bytes_done: int
    bytes_total: int
    seconds: float


def shape_config(shape: Shape, layers: int | None = None,
                 config_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json of `shape` with the demo tokenizer's special ids, `num_hidden_layers = layers`
    when given, then `config_overrides` applied on top."""
    if shape not in SHAPES:
        raise FixtureError(f"unknown fixture shape {shape!r}",
                           hint=f"use one of: {', '.join(SHAPES)}")
    if layers is not None and layers < 1:
        raise FixtureError(f"layers={layers} must be at least 1",
                           hint="leave it out for the full depth (32)")
    raw = json.loads(json.dumps(SHAPES[shape]))  # deep copy
    demo = json.loads((_demo_folder() / "generation_config.json").read_text(encoding="utf-8"))
    raw.update({key: demo[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")})
    if layers is not None:
        raw["num_hidden_layers"] = layers
    raw.update(json.loads(json.dumps(config_overrides or {})))
    return raw


def tensor_specs(raw: dict[str, Any]) -> list[TensorSpec]:
    """Every checkpoint tensor of `raw`'s model, in the reference model's state_dict order."""
    config = models.parse_config(raw)
    with torch.device("meta"):
        model = models.build_model(config)
    shapes = models.module_for(raw).expected_weights(model)
    return [TensorSpec(name, tuple(shape)) for name, shape in shapes.items()]


def fixture_bytes(shape: Shape, layers: int | None = None,
                  config_overrides: dict[str, Any] | None = None) -> int:
    """Bytes of the bf16 tensors of the fixture (the index's total_size; files add ~0.2 MB)."""
    specs = tensor_specs(shape_config(shape, layers, config_overrides))
    return sum(spec.nbytes(DTYPE) for spec in specs)


def init_std(name: str, config: Any) -> tuple[float, float]:
    """(mean, std) of the normal distribution tensor `name` is drawn from (module docstring);
    `config` is the parsed config (`models.parse_config`)."""
    if name.endswith("norm.weight"):
        return 1.0, BASE_STD
    if name == "model.embed_tokens.weight":
        return 0.0, 1.0 / config.embedding_scale
    if name == "lm_head.weight":
        return 0.0, BASE_STD * config.logit_divisor
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        depth = math.sqrt(2 * config.num_hidden_layers)
        return 0.0, BASE_STD / (depth * config.residual_scale)
    return 0.0, BASE_STD


def random_tensor(spec: TensorSpec, config: Any, seed: int, index: int) -> np.ndarray:
    """float32 [spec.shape] drawn from `init_std`; tensor `index` has its own generator, so a
    tensor's values depend on (seed, index) only, not on the shard size."""
    mean, std = init_std(spec.name, config)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    data = torch.randn(spec.shape, generator=gen).mul_(std).add_(mean)
    return data.numpy()


def next_token_rows(lm_head: np.ndarray, embed: np.ndarray, config: Any, seed: int) -> None:
    """Plant the successor structure in `lm_head` [V, hidden] in place (module docstring):
    lm_head[s(t)] += beta * embed[t] / |embed[t]|, s a permutation of the vocabulary seeded by
    `seed`. beta = NEXT_TOKEN_GAIN x divisor / (sqrt(hidden) x SURVIVING), where
    sqrt(hidden) x SURVIVING is the expected projection of norm(h_last) on the current token's
    unit embedding (SURVIVING: the part of the last hidden state's norm the embedding still is
    after the layers' updates, ~0.5 at 32 layers: RMS 1 against ~2)."""
    successor = np.random.default_rng(seed).permutation(lm_head.shape[0])
    beta = NEXT_TOKEN_GAIN * config.logit_divisor / (math.sqrt(lm_head.shape[1]) * SURVIVING)
    for start in range(0, lm_head.shape[0], 8192):   # 8192 rows at a time: bounded memory
        rows = embed[start:start + 8192]
        unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        lm_head[successor[start:start + 8192]] += np.float32(beta) * unit


def check_disk(folder: Path, needed: int) -> None:
    """Raise DiskSpaceError when the file system of `folder` has less than `needed` bytes free."""
    check_free_disk(folder, needed, f"writing the fixture into {folder}",
                    hint="free disk space, choose another folder (--out DIR or "
                         "$ARKINFER_FIXTURES), or write a reduced-depth fixture with --layers N")


def write_fixture(folder: Path, shape: Shape, *, layers: int | None = None, seed: int = 0,
                  shard_bytes: int = 5 * 2**30, progress: Callable[[Progress], None] | None = None,
                  config_overrides: dict[str, Any] | None = None) -> Path:
    """Write the fixture of `shape` into `folder` (module docstring) and return `folder`.

    One tensor is in memory at a time: its float32 values, the float32 copy and bf16 result of
    `shard_writer.to_storage` (5.3 GB for Llama-3's lm_head, the largest; 3.0 GB for MiniCPM's;
    measured peak RSS of a --layers 1 run: 5.4 GB / 3.2 GB, which the full depth does not raise),
    and while the lm_head is made, the embedding's float32 values too (2.1 GB / 1.2 GB more).
    The free disk is checked first; fixture.json is written last."""
    raw = shape_config(shape, layers, config_overrides)
    specs = tensor_specs(raw)
    total = sum(spec.nbytes(DTYPE) for spec in specs)
    folder = Path(folder)
    check_disk(folder, total + DISK_MARGIN)
    folder.mkdir(parents=True, exist_ok=True)
    shards = plan_shards(specs, DTYPE, shard_bytes)
    # shards finished once a tensor is written: its shard's index, + 1 for a shard's last tensor
    shards_done_after = {spec.name: i + 1 if spec is shard[-1] else i
                         for i, shard in enumerate(shards) for spec in shard}
    index = {spec.name: i for i, spec in enumerate(specs)}
    by_name = {spec.name: spec for spec in specs}
    config = models.parse_config(raw)
    start, done = time.perf_counter(), {"tensors": 0, "bytes": 0}

    def produce(spec: TensorSpec) -> np.ndarray:
        data = random_tensor(spec, config, seed, index[spec.name])
        if spec.name == "lm_head.weight":   # untied shapes only: both tensors exist
            embed = random_tensor(by_name["model.embed_tokens.weight"], config, seed,
                                  index["model.embed_tokens.weight"])
            next_token_rows(data, embed, config, seed)
        return data

    def on_tensor(spec: TensorSpec) -> None:
        done["tensors"] += 1
        done["bytes"] += spec.nbytes(DTYPE)
        if progress is not None:
            progress(Progress(done["tensors"], len(specs), shards_done_after[spec.name],
                              len(shards), done["bytes"], total, time.perf_counter() - start))

    write_shards(folder, specs, produce, DTYPE, shard_bytes, on_tensor=on_tensor)
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    for name in DEMO_FILES:
        shutil.copyfile(_demo_folder() / name, folder / name)
    stamp = {"version": VERSION, "shape": shape, "layers": layers, "seed": seed,
             "total_bytes": total,
             "config_overrides": json.loads(json.dumps(config_overrides or {}))}
    (folder / STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    return folder


def _demo_folder() -> Path:
    from arkinfer.frontend.demo import demo_model_path

    return demo_model_path()


def fixture_path(shape: Shape, layers: int | None = None, root: Path | None = None) -> Path:
    """<root>/<shape>[-L<layers>]; root defaults to $ARKINFER_FIXTURES, else
    ~/.cache/arkinfer/fixtures."""
    if root is None:
        env = os.environ.get("ARKINFER_FIXTURES")
        root = Path(env) if env else Path.home() / ".cache" / "arkinfer" / "fixtures"
    return Path(root).expanduser() / (shape if layers is None else f"{shape}-L{layers}")


def read_stamp(folder: Path) -> dict[str, Any] | None:
    """fixture.json of `folder`, or None when absent or unreadable (an incomplete fixture)."""
    try:
        stamp = json.loads((Path(folder) / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def ensure_fixture(shape: Shape, *, layers: int | None = None, root: Path | None = None,
                   seed: int = 0, shard_bytes: int = 5 * 2**30,
                   progress: Callable[[Progress], None] | None = None,
                   config_overrides: dict[str, Any] | None = None) -> Path:
    """The cached fixture folder (`fixture_path`), written first when its stamp is missing or
    differs (recipe version, shape, layers, seed, total bytes, overrides). It is written into a
    temporary sibling folder and renamed, so a killed run leaves no folder that looks complete."""
    folder = fixture_path(shape, layers, root)
    overrides = json.loads(json.dumps(config_overrides or {}))
    want = {"version": VERSION, "shape": shape, "layers": layers, "seed": seed,
            "total_bytes": fixture_bytes(shape, layers, overrides), "config_overrides": overrides}
    if read_stamp(folder) == want:
        return folder
    check_disk(folder, want["total_bytes"] + DISK_MARGIN)  # names this folder, not the temporary
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_partials(folder)
    temp = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    try:
        write_fixture(temp, shape, layers=layers, seed=seed, shard_bytes=shard_bytes,
                      progress=progress, config_overrides=overrides)
        shutil.rmtree(folder, ignore_errors=True)  # a stale or different fixture
        temp.rename(folder)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return folder


def _remove_dead_partials(folder: Path) -> None:
    """Delete `.<name>.partial-<pid>` siblings left by killed runs (their pid no longer runs)."""
    for partial in folder.parent.glob(f".{folder.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _print_progress(p: Progress) -> None:
    rate = p.bytes_done / max(p.seconds, 1e-9) / 1e6
    print(f"tensor {p.tensors_done}/{p.tensors_total}  shard {p.shards_done}/{p.shards_total}  "
          f"{p.bytes_done / 1e9:.2f}/{p.bytes_total / 1e9:.2f} GB  {rate:.0f} MB/s  "
          f"{p.seconds:.0f} s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arkinfer.testing.fixture_8b",
        description="Write an 8B-shaped random-weight checkpoint (bf16, HF layout) once into the "
                    "fixture cache and print its folder. Disk at full depth: minicpm4.1-8b "
                    "16.4 GB, llama-3-8b 16.1 GB; with --layers N, N x 0.47 GB (MiniCPM) / "
                    "0.44 GB (Llama) plus embed_tokens and lm_head (1.2 / 2.1 GB). Progress "
                    "goes to stderr, the folder to stdout.")
    parser.add_argument("--shape", choices=list(SHAPES), required=True)
    parser.add_argument("--layers", type=int, default=None,
                        help="number of decoder layers (default: the full 32)")
    parser.add_argument("--out", type=Path, default=None,
                        help="cache root (default: $ARKINFER_FIXTURES, else "
                             "~/.cache/arkinfer/fixtures)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        folder = ensure_fixture(args.shape, layers=args.layers, root=args.out, seed=args.seed,
                                progress=_print_progress)
    except ArkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
