"""What a GPTQ calibration will cost before it runs: FLOPs, seconds on this machine, peak memory.

    cost = predict_calibration(config, recipe, samples=8, seq_len=256,
                               matmul_flop_s=host["matmul_fp32_flop_s"])
    cost.seconds, cost.peak_bytes, cost.as_dict()

The model follows what `stream.calibrate` does for a Llama / MiniCPM decoder (GPTQ and P-GPTQ,
true-sequential, `sequential.SequentialForward`), block by block, with N = samples, T = seq_len,
H = hidden, I = FFN width, Hq / Hk query / KV heads of D:

- forward: the block's linears on the N·T calibration tokens plus the float reference on the
  batches holding the first REPORT_SEQUENCES sequences (2·tokens·params), causal attention
  (2·Hq·T²·D per sequence), and gate / up again when their output would pass
  `sequential.KEEP_BYTES` (`mlp_input_kept`);
- hessian: `Σ x xᵀ` for each distinct linear input (H for q/k/v and gate/up, Hq·D for o, I for
  down): 2·tokens·in² FLOPs each;
- solve: `gptq_quantize` for the stacked q/k/v, o, the stacked gate/up and down: per pass the lazy
  updates (out·in² FLOPs), the column loop (`in` columns of about `out`-wide vector work each)
  and, once, the inverse Cholesky factor (in³); static groups with two passes (the checkpoint
  layouts) run the column loop twice;
- report: each linear's output SNR from its Hessian (`base.hessian_snr_db`: two out x in x in
  products, 4·out·in² FLOPs).

Seconds are those FLOPs over the machine's measured fp32 matmul rate (`arkinfer doctor`) times a
phase efficiency, plus the column loop's per-column and per-element times, the constants in
`CPU_COSTS` measured by `benchmarks/calib_cost_fit.py` on shapes that are none of the models it
is checked on (benchmarks/calib_predict.py: the 1.2B and 8B fixtures). Below
`gptq.THREADED_COLUMNS` the solve runs on one thread, so its matmul rate is the machine's over its
threads.

Peak memory: one block's float32 weights, the largest GPTQ solve's working set (its float64
Hessian sum, the float32 Hessian, its permuted copy and the Cholesky factors, the weight's working
copies) and the block's [tokens, width] float32 activations. With x the block input, c
attention's output, h1 the residual after attention, d the MLP's input (kept only under
`sequential.KEEP_BYTES`) and y the output, the tensors alive at each moment (`stage_bytes`) are

    qkv: x + solve(q/k/v)     o: x + c + solve(o)     gate/up: x + h1 + solve(gate/up)
    down: x + h1 (+ d) + solve(down)                  output: x + h1 (+ d) + y

plus the float reference's outputs for the first REPORT_SEQUENCES sequences throughout.
- On a GPU the peak (`torch.cuda.max_memory_allocated`) is the largest of those moments: the
  caching allocator reuses what a stage freed.
- On the CPU the peak resident set also holds what the block freed: the C heap keeps freed
  batches until `stream` trims it after each block, so the block's activations are counted all
  together (x + c + h1 + d + y) beside its largest solve, plus the process's own resident set
  (`BASE_BYTES`: Python, torch, ArkInfer). Measured on 128 x 1024 tokens of a 1024-wide model, the
  resident set reached 2.66 GiB where the live moments above reach 1.79 GiB.

On a GPU (`predict_calibration_on_gpu`, `--device cuda`): the same FLOPs over the GPU's
float32 rate (TF32 is off while calibrating; `gpus.GPUS`) times one efficiency, `GPU_COSTS`,
fitted by benchmarks/calib_predict.py to the one GPU calibration measured (an H200, 8B blocks at
128 x 2048 tokens, benchmarks/results/calib_cuda_h200.json); the column loop's per-column time
is the CPU's (the same Python loop launching tiny kernels); peak GPU memory is the largest live
moment above (no process part: torch counts tensors only).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .block import default_batch, reference_rows
from .gptq import THREADED_COLUMNS
from .sequential import REPORT_SEQUENCES, mlp_input_kept


@dataclass(frozen=True)
class PhaseCosts:
    """Efficiencies (fractions of the fp32 matmul rate) and column-loop times; see the module
    docstring and benchmarks/calib_cost_fit.py."""

    forward: float          # block forward FLOPs / (matmul rate x forward seconds)
    hessian: float          # Σ x xᵀ FLOPs (full product) / (rate x seconds)
    update: float           # GPTQ lazy updates (out·in² per pass) / (rate x seconds)
    cholesky: float         # inverse Cholesky factor (in³) / (rate x seconds)
    report: float           # the per-linear SNR reports (4·out·in²) / (rate x seconds)
    column_s: float         # seconds per column per pass (Python and the tiny ops)
    column_elem_s: float    # seconds per column per pass per output row
    block_overhead_s: float  # per block: reading it, writing its codes and the next inputs


#: Measured by benchmarks/calib_cost_fit.py (results: calib_cost_fit_zen3.json).
CPU_COSTS = PhaseCosts(forward=0.63, hessian=1.177, update=1.055, cholesky=0.355, report=0.894,
                     column_s=9.25e-05, column_elem_s=1.53e-07, block_overhead_s=0.38)
#: Resident set of a process that has imported torch and ArkInfer's calibration (measured by
#: benchmarks/calib_cost_fit.py on Linux x86-64, torch 2.13 CPU).
BASE_BYTES = 223 * 2**20
#: One efficiency for every FLOP phase on a GPU, fitted by `python benchmarks/calib_predict.py
#: --fit-gpu` to the H200 run (calib_cuda_h200.json); the column loop's per-column time and the
#: per-block overhead are the CPU's (module docstring).
GPU_EFFICIENCY = 0.762
GPU_COSTS = PhaseCosts(forward=GPU_EFFICIENCY, hessian=GPU_EFFICIENCY, update=GPU_EFFICIENCY,
                       cholesky=GPU_EFFICIENCY, report=GPU_EFFICIENCY,
                       column_s=CPU_COSTS.column_s, column_elem_s=0.0,
                       block_overhead_s=CPU_COSTS.block_overhead_s)


@dataclass(frozen=True)
class Linear:
    """One `gptq_quantize` call: [out, in] (q/k/v and gate/up are stacked)."""

    name: str
    out: int
    inp: int


@dataclass(frozen=True)
class CalibrationCost:
    """Predicted cost of a whole calibration (`blocks` decoder blocks alike)."""

    blocks: int
    tokens: int
    flops: dict[str, float]        # per phase (forward, hessian, solve), whole model
    seconds_by_phase: dict[str, float]
    seconds: float
    peak_bytes: int
    peak_parts: dict[str, int]     # what the peak is made of (module docstring)
    matmul_flop_s: float
    peak_stage: str                # GPU: the moment of the peak (qkv, o, gate_up, down, output);
    #                                CPU: "block" (all the block's activations, module docstring)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def block_linears(cfg: dict[str, Any]) -> list[Linear]:
    """The solves of one decoder block of a Llama / MiniCPM `config.json` (dict)."""
    h = cfg["hidden_size"]
    hq = cfg["num_attention_heads"]
    hk = cfg.get("num_key_value_heads") or hq
    d = cfg.get("head_dim") or h // hq
    i = cfg["intermediate_size"]
    return [Linear("qkv", (hq + 2 * hk) * d, h), Linear("o", h, hq * d),
            Linear("gate_up", 2 * i, h), Linear("down", h, i)]


def solve_bytes(lin: Linear, passes: int) -> int:
    """Memory of one `gptq_quantize` call: the float64 Hessian sum, four float32 n x n matrices
    (Hessian, permuted copy, Cholesky factors) and the weight's float32 working copies (one
    more to keep the first pass's values for a second static pass)."""
    return lin.inp ** 2 * (8 + 4 * 4) + lin.out * lin.inp * 4 * (2 + (passes > 1))


def activation_widths(cfg: dict[str, Any], tokens: int) -> tuple[int, int, int]:
    """Widths of a block's activations: (hidden: x, h1, y; attention's output c; the MLP input d
    when it is kept between stages, else 0)."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    hq = cfg["num_attention_heads"]
    return h, hq * (cfg.get("head_dim") or h // hq), i if mlp_input_kept(tokens, i) else 0


def stage_bytes(cfg: dict[str, Any], tokens: int, passes: int,
                reference_tokens: int) -> dict[str, tuple[int, int]]:
    """{moment of a block: (float32 activation bytes alive, solve bytes)} for the moments of the
    module docstring; `reference_tokens`: positions whose float outputs are kept for the SNR."""
    h, c, d = activation_widths(cfg, tokens)
    qkv, o, gate_up, down = block_linears(cfg)

    def acts(width: int) -> int:
        return tokens * 4 * width + reference_tokens * 4 * h

    return {"qkv": (acts(h), solve_bytes(qkv, passes)),
            "o": (acts(h + c), solve_bytes(o, passes)),
            "gate_up": (acts(2 * h), solve_bytes(gate_up, passes)),
            "down": (acts(2 * h + d), solve_bytes(down, passes)),
            "output": (acts(3 * h + d), 0)}


def block_activation_bytes(cfg: dict[str, Any], tokens: int, reference_tokens: int) -> int:
    """Float32 bytes of every activation one block creates: x, c, h1, d (when kept), y and the
    float reference's outputs (the CPU's peak holds them all; module docstring)."""
    h, c, d = activation_widths(cfg, tokens)
    return tokens * 4 * (3 * h + c + d) + reference_tokens * 4 * h


def _passes(recipe: Any, static_passes: int) -> int:
    return max(1, static_passes) if not getattr(recipe, "desc_act", False) else 1


def predict_calibration(cfg: dict[str, Any], recipe: Any, samples: int, seq_len: int,
                        matmul_flop_s: float, *, threads: int = 2, static_passes: int = 2,
                        costs: PhaseCosts = CPU_COSTS, process_bytes: int | None = None,
                        gpu: bool = False) -> CalibrationCost:
    """Predicted FLOPs, seconds and peak resident bytes of calibrating `cfg` (a config.json
    dict) with GPTQ `recipe` on `samples` x `seq_len` tokens, on a CPU whose fp32 matmul rate
    with `threads` threads is `matmul_flop_s`. `static_passes`: GPTQ passes over static groups
    (`recipe.static_passes_for(format)` in a build). `process_bytes`: the calibrating process's
    resident set before it starts (a build has loaded more than a fresh process; default
    BASE_BYTES). `gpu`: the peak is of GPU memory (`predict_calibration_on_gpu`)."""
    n, t = samples, seq_len
    tokens = n * t
    ref_seqs = reference_rows(REPORT_SEQUENCES, n, default_batch(t))
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    hq = cfg["num_attention_heads"]
    d = cfg.get("head_dim") or h // hq
    layers = cfg["num_hidden_layers"]
    linears = block_linears(cfg)
    params = sum(lin.out * lin.inp for lin in linears)
    passes = _passes(recipe, static_passes)

    keep_d = mlp_input_kept(tokens, i)
    fwd = 2.0 * (tokens + ref_seqs * t) * params + 2.0 * hq * t * t * d * (n + ref_seqs)
    if not keep_d:
        fwd += 2.0 * tokens * 2 * i * h
    hess = 2.0 * tokens * (2 * h * h + (hq * d) ** 2 + i * i)
    update = sum(lin.out * lin.inp ** 2 for lin in linears) * passes
    chol = sum(float(lin.inp) ** 3 for lin in linears)
    report = 4.0 * sum(lin.out * lin.inp ** 2 for lin in linears)

    def rate(cols: int) -> float:  # small solves run on one thread (gptq.single_thread)
        return matmul_flop_s if cols >= THREADED_COLUMNS else matmul_flop_s / max(threads, 1)

    solve_s = sum(lin.out * lin.inp ** 2 * passes / (costs.update * rate(lin.inp))
                  + float(lin.inp) ** 3 / (costs.cholesky * rate(lin.inp))
                  + lin.inp * passes * (costs.column_s + costs.column_elem_s * lin.out)
                  for lin in linears)
    per_block = {"forward": fwd / (costs.forward * matmul_flop_s),
                 "hessian": hess / (costs.hessian * matmul_flop_s),
                 "solve": solve_s, "report": report / (costs.report * matmul_flop_s),
                 "overhead": costs.block_overhead_s}
    seconds_by_phase = {k: round(v * layers, 1) for k, v in per_block.items()}
    flops = {"forward": fwd * layers, "hessian": hess * layers,
             "solve": (update + chol) * layers,  # as the efficiencies count them
             "report": report * layers}

    stages = stage_bytes(cfg, tokens, passes, ref_seqs * t)
    if gpu:  # the largest live moment
        stage = max(stages, key=lambda name: sum(stages[name]))
        acts, solve = stages[stage]
        base = 0
    else:  # every activation of the block, held until the heap is trimmed, and the widest solve
        stage = "block"
        acts = block_activation_bytes(cfg, tokens, ref_seqs * t)
        solve = max(stages[name][1] for name in stages)
        base = BASE_BYTES if process_bytes is None else process_bytes
    parts = {"process": base, "block_weights": params * 4, "activations": acts, "solve": solve}
    return CalibrationCost(layers, tokens, flops, seconds_by_phase,
                           round(sum(per_block.values()) * layers, 1), sum(parts.values()), parts,
                           matmul_flop_s, stage)


def predict_calibration_on_gpu(cfg: dict[str, Any], recipe: Any, samples: int, seq_len: int,
                               gpu: Any, *, static_passes: int = 2) -> CalibrationCost:
    """`predict_calibration` for `--device cuda` on `gpu` (a `gpus.GpuSpec`): its float32 rate,
    `GPU_COSTS`, every solve at the full rate, and peak bytes of GPU memory (no process part)."""
    return predict_calibration(cfg, recipe, samples, seq_len, gpu.fp32_flop_s, threads=1,
                               static_passes=static_passes, costs=GPU_COSTS, gpu=True)
