"""Lower a Hugging Face folder (float, or quantised in a gguf-* format) to one `model.gguf`.

    result = lower(LowerRequest(model_dir, source_dir, recipe, "f16", target, out_dir))

The file is written by gguf-py's GGUFWriter in streaming order (tensor infos first, then one
tensor at a time), so peak memory is about one tensor whatever the model size. Architectures:
`minicpm` (MiniCPM4 / 4.1), `llama` (Llama 2/3, SmolLM2, Mistral), `qwen2`, `qwen3`.
"""

from __future__ import annotations

import os
from collections import deque
from itertools import islice
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from arkinfer.quant.formats.gguf_blocks import GGMLType

from arkinfer.backend import LowerRequest, LowerResult
from arkinfer.errors import ArkError
from arkinfer.frontend.checkpoint import open_checkpoint
from arkinfer.frontend.gguf_model import ARCHS, ArchSpec
from arkinfer.lowering.versions import version

from .fast_writer import FastArrayWriter
from .llamacpp_runtime import infllmv2_built
from .metadata import write_metadata
from .plan import ggml_rtn, plan_model
from .tensors import tensor_bytes
from .tokenizer import read_vocab, write_vocab

GGUF_FILE = "model.gguf"
# HF model_type -> llama.cpp architecture (Mistral loads as llama in upstream llama.cpp).
ARCH_OF = {"llama": "llama", "mistral": "llama", "minicpm": "minicpm", "qwen2": "qwen2",
           "qwen3": "qwen3"}
FILE_TYPES = {GGMLType.F32: "ALL_F32", GGMLType.F16: "MOSTLY_F16", GGMLType.BF16: "MOSTLY_BF16",
              GGMLType.Q4_0: "MOSTLY_Q4_0", GGMLType.Q4_1: "MOSTLY_Q4_1",
              GGMLType.Q8_0: "MOSTLY_Q8_0", GGMLType.TQ1_0: "MOSTLY_TQ1_0",
              GGMLType.TQ2_0: "MOSTLY_TQ2_0", GGMLType.Q5_0: "MOSTLY_Q5_0",
              GGMLType.Q5_1: "MOSTLY_Q5_1", GGMLType.Q4_K: "MOSTLY_Q4_K_M",
              GGMLType.Q5_K: "MOSTLY_Q5_K_M", GGMLType.Q6_K: "MOSTLY_Q6_K",
              GGMLType.IQ4_NL: "MOSTLY_IQ4_NL"}


def spec_for_model_type(model_type: str) -> ArchSpec:
    """The llama.cpp architecture of a Hugging Face `model_type` (ArkError when none)."""
    if model_type not in ARCH_OF:
        raise ArkError(f"model_type {model_type!r} has no llama.cpp architecture in the GGUF "
                       "backend", hint=f"supported model types: {', '.join(ARCH_OF)}")
    return ARCHS[ARCH_OF[model_type]]


def _ops(spec: ArchSpec, config, plan) -> dict[str, str]:
    types = sorted({t.qtype.name for t in plan.tensors if len(t.shape) == 2})
    sparse = getattr(config, "sparse_config", None)
    attention = ("dense (llama.cpp ignores arkinfer.sparse.*; InfLLM v2 is not run)" if sparse
                 else "dense (llama.cpp flash/soft-max attention)")
    if sparse and infllmv2_built():
        attention = ("InfLLM v2 (patched llama.cpp, built by `arkinfer doctor "
                     "--build-llamacpp`); upstream llama.cpp ignores "
                     "minicpm.attention.indexer.* / arkinfer.sparse.* and runs this file dense")
    rope = ("NORM (interleaved pairs; q/k rows permuted at lowering)" if spec.permuted_qk
            else "NEOX (rotate-half; rows unpermuted)")
    if (config.rope_scaling or {}).get("rope_type") == "longrope":
        rope += "; LongRoPE factors chosen by context size (n_ctx > original -> long)"
    return {"attention": attention, "linear": f"ggml matmul over {', '.join(types)}",
            "rms_norm": "ggml rms_norm", "rope": rope}


class _Prepared:
    """make(item) for every item, in order, computed by `workers` threads (default: the CPU
    count) at most `ahead` items in front of the consumer, so peak memory stays a few tensors.
    The first `ahead` start at construction, so they are quantised while the caller does other
    work (reading the tokenizer, writing the header); numpy's and torch's quantisers release the
    GIL. Iterate once; `close()` (also on error) stops the threads."""

    def __init__(self, make, items, workers: int | None = None, ahead: int = 4) -> None:
        self.make, self.items = make, iter(items)
        self.pool = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1)
        self.pending = deque(self.pool.submit(make, item) for item in islice(self.items, ahead))

    def __iter__(self):
        while self.pending:
            result = self.pending.popleft().result()
            for item in islice(self.items, 1):
                self.pending.append(self.pool.submit(self.make, item))
            yield result

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def lower(request: LowerRequest) -> LowerResult:
    """Write `request.out_dir / model.gguf`; returns files, ops, toolchain, notes, layers."""
    ckpt = open_checkpoint(request.model_dir, with_tokenizer=False)
    config = ckpt.config
    spec = spec_for_model_type(config.model_type)
    source = None
    if Path(request.source_dir).resolve() != Path(request.model_dir).resolve():
        source = open_checkpoint(request.source_dir, with_tokenizer=False)
    plan = plan_model(ckpt, spec, request.recipe, request.dtype, request.options, source)
    tensors = _Prepared(lambda t: tensor_bytes(ckpt, t, source), plan.tensors)
    try:
        return _write(request, ckpt, spec, plan, source, tensors)
    finally:
        tensors.close()


def _write(request: LowerRequest, ckpt, spec: ArchSpec, plan, source, tensors: _Prepared
           ) -> LowerResult:
    """The GGUF file (header, metadata, tokenizer, tensors as `tensors` yields them)."""
    import gguf

    config = ckpt.config
    tok_dir = request.model_dir if (request.model_dir / "tokenizer.json").is_file() \
        else request.source_dir
    vocab = read_vocab(Path(tok_dir), config.vocab_size, ckpt.raw_config)
    out = Path(request.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / GGUF_FILE
    quantised = plan.quantised
    recipe = request.recipe.describe() if request.recipe is not None else None
    writer = FastArrayWriter(str(path), spec.gguf_arch)
    try:
        write_metadata(writer, spec, config, ckpt.raw_config,
                       name=Path(request.source_dir).name or spec.gguf_arch,
                       file_type=int(gguf.LlamaFileType[FILE_TYPES[plan.main_type()]]),
                       quantised=quantised, recipe=recipe)
        write_vocab(writer, vocab)
        for t in plan.tensors:
            float_like = t.qtype in (GGMLType.F32, GGMLType.F16)
            dtype = {GGMLType.F32: np.float32, GGMLType.F16: np.float16}.get(t.qtype, np.uint8)
            writer.add_tensor_info(t.name, t.shape if float_like else t.byte_shape,
                                   np.dtype(dtype), t.nbytes,
                                   raw_dtype=None if float_like else gguf.GGMLQuantizationType(
                                       int(t.qtype)))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, (t, data) in enumerate(zip(plan.tensors, tensors, strict=True)):
            request.progress(f"tensor {i + 1}/{len(plan.tensors)} {t.name} ({t.qtype.name})")
            writer.write_tensor_data(data)
    finally:
        writer.close()
    toolchain = {"gguf": version("gguf") or "unknown"}
    if version("llama_cpp_python"):
        toolchain["llama-cpp-python"] = version("llama_cpp_python")
    notes = [f"tokenizer: {vocab.kind}", *plan.notes]
    quant = None
    if source is None and ggml_rtn(request.recipe, request.options):  # rounded here by ggml
        quant = {"bits_per_weight": _linear_bits(plan),
                 "quantised_by": f"ggml's reference quantiser (gguf {version('gguf')})"}
    return LowerResult(files=[GGUF_FILE], ops=_ops(spec, config, plan), toolchain=toolchain,
                       notes=notes, layers=plan.layers, quant=quant)


def _linear_bits(plan) -> float:
    """Bits per weight of the 2-D tensors inside the layers (the linears), as written."""
    linears = [t for t in plan.tensors if len(t.shape) == 2 and t.name.startswith("blk.")]
    elements = sum(t.shape[0] * t.shape[1] for t in linears)
    return round(8 * sum(t.nbytes for t in linears) / max(elements, 1), 4)
