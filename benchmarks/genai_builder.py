"""onnxruntime-genai's model builder as a second onnxruntime reference for
onnx_vs_llamacpp.py (`--genai-python`): build SmolLM2 with the builder (int4 MatMulNBits, same
block size and accuracy_level as our runner), then time its decode two ways:

    same runtime   its model.onnx in *this* onnxruntime, fed step by step like our runner:
                   past_key_values.{i}.* and present.{i}.* bound to one preallocated buffer
                   each (GQA's past_present_share_buffer mode, as genai's generator and our
                   runner's SharedKV run), the decode logits into a buffer of ours
    genai's loop   its own Generator (og.Model / og.Generator, shared past/present buffers) in
                   the interpreter that has onnxruntime-genai, with its own onnxruntime

Both loops time `steps` model runs: genai's first generate_next_token after append_tokens only
samples from the prompt's logits (no model run), so it runs untimed.

onnxruntime-genai needs torch + transformers for the builder; keep it out of ArkInfer's venv
(the last line lets onnx_vs_llamacpp.py also time our runner on genai's own onnxruntime):

    python3 -m venv /tmp/genai-venv
    /tmp/genai-venv/bin/pip install onnxruntime-genai torch==2.13.0 transformers onnx onnx_ir
    /tmp/genai-venv/bin/pip install --no-deps -e .
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import torch


def build(python: str, hf_dir: Path, out: Path, block_size: int, accuracy_level: int) -> Path:
    """Run the builder (int4, CPU) in `python`; returns the output folder."""
    cmd = [python, "-m", "onnxruntime_genai.models.builder", "-m", str(hf_dir), "-o", str(out),
           "-p", "int4", "-e", "cpu", "-c", str(out.parent / "genai-cache"), "--extra_options",
           f"block_size={block_size}", f"accuracy_level={accuracy_level}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not (out / "model.onnx").is_file():
        raise RuntimeError(f"onnxruntime-genai's builder failed ({' '.join(cmd)}):\n"
                           f"{done.stderr[-2000:]}")
    return out


class GenaiGraphRunner:
    """The builder's model.onnx in this process's onnxruntime: reset / prefill / decode -> the
    last position's logits [V] (what _decode_rate needs). KV: one f32 [1, Hkv, capacity, D]
    buffer per past/present pair, bound to both (GQA updates it in place; attention_mask's
    length tells it how many rows are valid), as genai's generator binds them."""

    def __init__(self, folder: Path, threads: int, capacity: int = 256) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(folder / "model.onnx"), opts,
                                            providers=["CPUExecutionProvider"])
        self.past = [i.name for i in self.session.get_inputs()
                     if i.name.startswith("past_key_values.")]
        decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        self.kv_shape = [1, int(decoder["num_key_value_heads"]), capacity,
                         int(decoder["head_size"])]
        self.reset()

    def reset(self) -> None:
        import onnxruntime as ort

        self.arrays = {name: np.zeros(self.kv_shape, np.float32) for name in self.past}
        self.binding = self.session.io_binding()
        self.binding.bind_output("logits")     # first: get_outputs()[0] after a prefill
        for name, a in self.arrays.items():
            value = ort.OrtValue.ortvalue_from_numpy(a)      # shares a's memory
            self.binding.bind_ortvalue_input(name, value)
            self.binding.bind_ortvalue_output(name.replace("past_key_values.", "present."), value)
        self.step_logits: np.ndarray | None = None
        self.pos = 0

    def _step(self, ids: list[int]) -> torch.Tensor:
        import onnxruntime as ort

        total = self.pos + len(ids)
        if total > self.kv_shape[2]:
            raise ValueError(f"{total} positions exceed the KV buffers' {self.kv_shape[2]} rows")
        decode = len(ids) == 1 and self.step_logits is not None
        if decode:
            self.binding.bind_ortvalue_output("logits", self.step_value)
        else:           # unallocated: ORT sizes it for this T
            self.binding.bind_output("logits")
        self.binding.bind_cpu_input("input_ids", np.asarray([ids], np.int64))
        self.binding.bind_cpu_input("attention_mask", np.ones([1, total], np.int64))
        self.session.run_with_iobinding(self.binding)
        self.pos = total
        if decode:
            return torch.from_numpy(self.step_logits[0, -1].copy())
        logits = np.array(self.binding.get_outputs()[0].numpy())
        if self.step_logits is None:    # the decode steps' logits buffer, [1, 1, V]
            self.step_logits = np.zeros([1, 1, logits.shape[-1]], np.float32)
            self.step_value = ort.OrtValue.ortvalue_from_numpy(self.step_logits)
        return torch.from_numpy(logits[0, -1])

    def prefill(self, ids: list[int]) -> torch.Tensor:
        return self._step(list(ids))

    def decode(self, token: int) -> torch.Tensor:
        return self._step([int(token)])


_GENERATOR = """
import json, sys, time
import onnxruntime_genai as og
folder, prompt, steps, reps, threads = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:6])
config = og.Config(folder)
config.clear_providers()
config.overlay(json.dumps({"model": {"decoder": {"session_options": {
    "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
model = og.Model(config)
rates = []
for rep in range(reps + 1):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + steps + 1, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    gen.generate_next_token()   # samples from the prompt's logits: no model run, untimed
    t0 = time.perf_counter()
    for _ in range(steps):
        gen.generate_next_token()
    if rep:
        rates.append(steps / (time.perf_counter() - t0))
print(json.dumps({"rates": rates, "onnxruntime_genai": og.__version__}))
"""


def generator_rates(python: str, folder: Path, prompt: list[int], steps: int, reps: int,
                    threads: int, env: dict[str, str] | None = None) -> dict:
    """tokens/s of genai's own loop: `steps` generate_next_token calls, each one model run,
    after the prompt (append_tokens runs the prefill; the first generate_next_token only samples
    from its logits and is not timed), `reps` times after a warm-up; env: the child's
    environment (default: this process's)."""
    done = subprocess.run([python, "-c", _GENERATOR, str(folder), json.dumps(prompt), str(steps),
                           str(reps), str(threads)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"onnxruntime-genai's generator failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
