"""InfLLM v2 in llama.cpp (ArkInfer's patch) vs upstream llama.cpp's dense attention: decode speed.

A MiniCPM4.1-8B-shaped GGUF (hidden 4096, 32 query / 2 KV heads of 128, FFN 16384, vocab 73448,
MiniCPM4.1's sparse_config) with random Q4_0 weights, `--layers` of its 32 layers (default 8: a
128K f16 KV cache of all 32 layers plus the patched build's compression cache needs ~6 GiB more
than this shared machine should take; every layer costs the same, so per-layer ratios hold).

Filling 32K / 128K tokens by prefill is hours on 2 cores, so the KV cache is loaded instead: a
64-token prefill gives a llama.cpp sequence state (`llama_state_seq_get_data`), whose per-cell rows
(K, V, and in the patched build the compression cache's rows) are tiled to N cells with positions
0 .. N-1 and loaded back (`llama_state_seq_set_data`). The values repeat every 64 positions, which
changes which blocks are selected but not how much work a step does.

Each runtime runs in its own child process (`--worker`): upstream = the llama-cpp-python wheel's
libllama, patched = `arkinfer doctor --build-llamacpp`'s (LLAMA_CPP_LIB_PATH). A row is the median
decode step (`llama_decode` of one token) over `--steps` steps after 2 warm-up steps, flash
attention on, f16 KV cache, `--threads` threads. The attention share of a step is estimated as
(step at N − step at 256 cached tokens) / step at N: the rest of the step (matmuls, lm_head) does
not depend on N.

    .venv/bin/python benchmarks/llamacpp_infllmv2.py                    # 32K and 128K, 8 layers
    .venv/bin/python benchmarks/llamacpp_infllmv2.py --contexts 32768 --layers 4 --steps 8
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 4096, 32, 2, 128, 16384, 73448
SPARSE = {"kernel_size": 32, "kernel_stride": 16, "block_size": 64, "init_blocks": 1,
          "window_size": 2048, "topk": 64, "use_nope": False, "dense_len": 8192}
TEMPLATE = 64
RESULTS = Path(__file__).parent / "results" / "llamacpp_infllmv2.json"


def q4_0_rows(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_0 blocks (f16 scale 0.02 / sqrt(cols / 32), random nibbles): uint8 [rows, cols / 32 * 18]."""
    nb = cols // 32
    out = np.empty((rows, nb, 18), dtype=np.uint8)
    d = np.full((rows, nb), 0.02 / np.sqrt(nb), dtype=np.float16)
    out[:, :, :2] = d.view(np.uint8).reshape(rows, nb, 2)
    out[:, :, 2:] = rng.integers(0, 256, size=(rows, nb, 16), dtype=np.uint8)
    return out.reshape(rows, nb * 18)


def write_gguf(path: Path, layers: int) -> None:
    """MiniCPM4.1-8B-shaped GGUF, random Q4_0 linears, F32 norms, with the InfLLM v2 keys."""
    import gguf

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from arkinfer.backends.gguf.metadata import _add_indexer, _add_sparse

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "minicpm")
    w.add_type("model")
    w.add_name("minicpm41-8b-shaped-random")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(131072 + 1024)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(layers)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(VOCAB)
    w.add_embedding_scale(12.0)
    w.add_residual_scale(1.4 / np.sqrt(32))
    w.add_logit_scale(HIDDEN / 256)
    _add_sparse(w, SPARSE)
    _add_indexer(w, "minicpm", SPARSE)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>".encode() for i in range(VOCAB)])
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([int(gguf.TokenType.NORMAL)] * VOCAB)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    Q4 = gguf.GGMLQuantizationType.Q4_0
    w.add_tensor("token_embd.weight", q4_0_rows(VOCAB, HIDDEN, rng), raw_dtype=Q4)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output.weight", q4_0_rows(VOCAB, HIDDEN, rng), raw_dtype=Q4)
    for i in range(layers):
        for name, rows, cols in (("attn_q", HEADS * HEAD_DIM, HIDDEN), ("attn_k", KV_HEADS * HEAD_DIM, HIDDEN),
                                 ("attn_v", KV_HEADS * HEAD_DIM, HIDDEN), ("attn_output", HIDDEN, HEADS * HEAD_DIM),
                                 ("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN)):
            w.add_tensor(f"blk.{i}.{name}.weight", q4_0_rows(rows, cols, rng), raw_dtype=Q4)
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# -- llama.cpp sequence state: parse a small one, tile it to N cells -------------------------------

HEADER = 8   # llama_state_seq_get_data: io magic u32, seq_id i32


def _parse_caches(blob: bytes) -> list[dict]:
    """After the 8-byte header, llama_kv_cache::state_write for one sequence, once per cache
    (MSA: base, then indexer):
    n_stream u32 | cell_count u32 | cells (pos i32, n_seq u32, seq ids i32) | v_trans u32 |
    n_layer u32 | per layer K: type i32, row u64, rows | per layer V: type i32, row u64, rows."""
    caches, off = [], HEADER
    while off < len(blob):
        n_stream, cells = struct.unpack_from("<II", blob, off)
        assert n_stream == 1, n_stream
        off += 8
        for _ in range(cells):
            _pos, n_seq = struct.unpack_from("<iI", blob, off)
            off += 8 + 4 * n_seq
        v_trans, n_layer = struct.unpack_from("<II", blob, off)
        assert v_trans == 0, "flash attention keeps V untransposed"
        off += 8
        parts = []
        for _ in range(2 * n_layer):
            typ, row = struct.unpack_from("<iQ", blob, off)
            off += 12
            data = np.frombuffer(blob, dtype=np.uint8, count=row * cells, offset=off).reshape(cells, row)
            off += row * cells
            parts.append((typ, row, data))
        caches.append({"n_layer": n_layer, "parts": parts})
    return caches


def tiled_state(blob: bytes, n: int) -> bytes:
    out = bytearray(blob[:HEADER])
    for cache in _parse_caches(blob):
        out += struct.pack("<II", 1, n)
        meta = np.zeros((n, 3), dtype=np.int32)
        meta[:, 0] = np.arange(n)
        meta[:, 1] = 1
        out += meta.tobytes()
        out += struct.pack("<II", 0, cache["n_layer"])
        for typ, row, data in cache["parts"]:
            out += struct.pack("<iQ", typ, row)
            out += np.tile(data, (-(-n // len(data)), 1))[:n].tobytes()
    return bytes(out)


def worker(model: str, contexts: list[int], steps: int, threads: int) -> dict:
    """Runs in a child process: decode step times (s) at every context, for this libllama."""
    import llama_cpp

    n_ctx = max(contexts) + 256
    llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=TEMPLATE, n_ubatch=TEMPLATE,
                          flash_attn=True, n_threads=threads, n_threads_batch=threads,
                          logits_all=False, verbose=False)
    ctx = llm._ctx.ctx
    llm.eval(list(range(10, 10 + TEMPLATE)))
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
    template = bytes(buf)
    out = {}
    token = (llama_cpp.llama_token * 1)(100)
    for n in contexts:
        llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        state = tiled_state(template, n)
        src = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        del state
        if llama_cpp.llama_state_seq_set_data(ctx, src, len(src), 0) == 0:
            raise RuntimeError(f"llama.cpp refused the {n}-cell state")
        del src
        times = []
        for i in range(steps + 2):
            t = time.perf_counter()
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(token, 1)) != 0:
                raise RuntimeError(f"llama_decode failed at {n + i}")
            if i >= 2:
                times.append(time.perf_counter() - t)
        out[n] = statistics.median(times)
    return out


def run_worker(lib: Path | None, model: Path, contexts: list[int], steps: int, threads: int) -> dict:
    env = dict(os.environ)
    env.pop("LLAMA_CPP_LIB_PATH", None)
    if lib is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(lib)
    cmd = [sys.executable, __file__, "--worker", str(model), "--contexts", ",".join(map(str, contexts)),
           "--steps", str(steps), "--threads", str(threads)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"worker failed ({'patched' if lib else 'upstream'}):\n{done.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="32768,131072")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--model", default="/tmp/arkinfer-minicpm41-8b-shaped.gguf")
    ap.add_argument("--worker", metavar="GGUF")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.worker:
        print(json.dumps(worker(args.worker, [256, *contexts], args.steps, args.threads)))
        return

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from machine import machine_info

    from arkinfer.backends.gguf.llamacpp_build import require_patched_library

    lib = require_patched_library()
    model = Path(args.model).with_name(Path(args.model).stem + f"-{args.layers}l.gguf")
    if not model.is_file():
        print(f"writing {model} ({args.layers} layers) ...", flush=True)
        write_gguf(model, args.layers)
    rows = []
    load_before = list(os.getloadavg())
    upstream = run_worker(None, model, contexts, args.steps, args.threads)
    patched = run_worker(lib, model, contexts, args.steps, args.threads)
    for n in contexts:
        d, s = upstream[n], patched[n]
        da, sa = d - upstream[256], s - patched[256]
        rows.append({"context": n, "layers": args.layers,
                     "dense_tok_s": 1 / d, "sparse_tok_s": 1 / s, "decode_speedup": d / s,
                     "dense_attention_share": da / d, "sparse_attention_share": sa / s,
                     "attention_speedup": da / sa if sa > 0 else None,
                     "dense_step_ms": 1e3 * d, "sparse_step_ms": 1e3 * s,
                     "step_ms_at_256": {"dense": 1e3 * upstream[256], "sparse": 1e3 * patched[256]}})
    load_after = list(os.getloadavg())
    print("| context | layers | upstream dense tok/s | patched InfLLM v2 tok/s | decode x | "
          "attention share dense / sparse | attention x |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        att = f"{r['attention_speedup']:.1f}x" if r["attention_speedup"] else "-"
        print(f"| {r['context'] // 1024}K | {r['layers']} | {r['dense_tok_s']:.2f} | {r['sparse_tok_s']:.2f} | "
              f"{r['decode_speedup']:.2f}x | {100 * r['dense_attention_share']:.0f} % / "
              f"{100 * r['sparse_attention_share']:.0f} % | {att} |")
    print(f"threads {args.threads}; load average before {load_before}, after {load_after}")
    if not args.no_save:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps({"date": datetime.date.today().isoformat(),
                                       "machine": machine_info(), "threads": args.threads,
                                       "load_average_before": load_before,
                                       "load_average_after": load_after,
                                       "steps": args.steps, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
