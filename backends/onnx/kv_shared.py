"""The KV cache of a fused graph as preallocated buffers that GroupQueryAttention updates in place
(I/O binding: each layer's past.{i}.k and present.{i}.k are bound to one OrtValue), as
onnxruntime-genai runs its models (past_present_share_buffer). Nothing is concatenated or copied
between steps: GQA sees past_key == present_key (pointer equality, its share-buffer mode), writes
the T new rows at P..P+T-1 and attends over the first seqlens_k + 1 rows (seqlens_k comes from the
positions, contrib_fused.py), so the rows past P+T are never read.

    buffers  f32 [1, Hkv, C, D] per past.{i}.k / .v; C starts at `INITIAL` rows and doubles
             (rows 0..P-1 copied) when a call needs more, up to the rope caches' rows

Only for graphs where every cache input feeds GroupQueryAttention directly and every cache output
comes from it (`shareable`); InfLLM v2 models (compressed-key caches, concat in the function) and
graphs with an attention left as a function keep the plain numpy cache.

    taps     {output name: H}: further outputs f32 [1, T, H] (EAGLE-3's taps, layer_graph.py),
             read after every call into `tap_values` ({name: [T, H]}); a decode step writes them
             into buffers of ours bound once, as it does the logits
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

INITIAL = 256  # rows per buffer before the first growth (a 64+64-token benchmark never grows)


def _fold_output_identities(model: onnx.ModelProto) -> None:
    """output = Identity(x) -> x's producer writes the output itself (the lowering names graph
    outputs through an Identity: a bound present.* must be GQA's own output to be shared, and
    the logits need no copy)."""
    outputs = {o.name for o in model.graph.output}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    producer = {o: n for n in model.graph.node for o in n.output}
    keep = []
    for node in model.graph.node:
        src = producer.get(node.input[0]) if node.op_type == "Identity" else None
        if src is not None and node.output[0] in outputs and readers[node.input[0]] == 1 and \
                node.input[0] not in outputs:
            src.output[list(src.output).index(node.input[0])] = node.output[0]
            continue
        keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)


def shareable(model: onnx.ModelProto) -> bool:
    """Rewrite present.* to be GroupQueryAttention's own outputs (in place), then: is every
    past.* graph input read only as GQA's past_key/value, whose present_key/value is the
    matching present.* output?"""
    pasts = [i.name for i in model.graph.input if i.name.startswith("past.")]
    if not pasts:
        return False
    _fold_output_identities(model)
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in model.graph.node:
        for slot, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, slot))
    for name in pasts:
        found = readers.get(name, [])
        if len(found) != 1:
            return False
        node, slot = found[0]
        present = name.replace("past.", "present.", 1)
        if node.op_type != "GroupQueryAttention" or slot not in (3, 4) or \
                node.output[slot - 2] != present:
            return False
    return True


class SharedKV:
    """Bound buffers for `session`'s past.* inputs; `run(tokens, positions)` -> logits."""

    def __init__(self, session: ort.InferenceSession, limit: int,
                 taps: dict[str, int] | None = None) -> None:
        self.session, self.limit = session, limit
        self.taps = dict(taps or {})
        self.step_taps = {name: np.zeros([1, 1, h], np.float32) for name, h in self.taps.items()}
        self.step_tap_values = {name: ort.OrtValue.ortvalue_from_numpy(a)
                                for name, a in self.step_taps.items()}
        self.tap_values: dict[str, np.ndarray] = {}  # the last call's taps, [T, H] each
        self.shapes = {i.name: [int(d) if isinstance(d, int) else 0 for d in i.shape]
                       for i in session.get_inputs() if i.name.startswith("past.")}
        # a decode step's logits land in a buffer of ours: no get_outputs() (one Python
        # wrapper per bound output, 61 on SmolLM2) per step
        vocab = int(session.get_outputs()[0].shape[-1])
        self.step_logits = np.zeros([1, 1, vocab], np.float32)
        self.step_value = ort.OrtValue.ortvalue_from_numpy(self.step_logits)
        # a decode step's token and position: written in place, bound once (as genai does)
        self.step_token = np.zeros([1, 1], np.int64)
        self.step_position = np.zeros([1], np.int64)
        self.step_inputs = {"tokens": ort.OrtValue.ortvalue_from_numpy(self.step_token),
                            "positions": ort.OrtValue.ortvalue_from_numpy(self.step_position)}
        self.reset()

    def reset(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.capacity = 0
        self._grow(min(INITIAL, self.limit), 0)

    def _grow(self, rows: int, keep: int) -> None:
        """Buffers of `rows` rows holding the first `keep` rows of the old ones."""
        new = {}
        for name, shape in self.shapes.items():
            a = np.zeros([shape[0], shape[1], rows, shape[3]], np.float32)
            if keep:
                a[:, :, :keep] = self.arrays[name][:, :, :keep]
            new[name] = a
        self.arrays, self.capacity = new, rows
        self.decode_bound = False      # the step buffers are bound to this binding
        self.binding = self.session.io_binding()
        self.binding.bind_output("logits")  # first: get_outputs()[0] after a prefill
        for name, a in self.arrays.items():
            value = ort.OrtValue.ortvalue_from_numpy(a)  # shares a's memory
            self.binding.bind_ortvalue_input(name, value)
            self.binding.bind_ortvalue_output(name.replace("past.", "present.", 1), value)
        for name in self.taps:  # bound last: get_outputs()[-len(taps):] after a prefill
            self.binding.bind_output(name)

    def step(self, token: int, position: int) -> np.ndarray:
        """One decode step at `position` (< capacity) -> logits f32 [V], a copy of its own (the
        next step overwrites the bound buffer). The binding's pybind object is run directly:
        the Python wrapper's per-call checks are for WebGPU graph capture."""
        if not self.decode_bound:   # after a prefill or a growth: bind the step buffers
            self.binding.bind_ortvalue_output("logits", self.step_value)
            for name, value in self.step_inputs.items():
                self.binding.bind_ortvalue_input(name, value)
            for name, value in self.step_tap_values.items():
                self.binding.bind_ortvalue_output(name, value)
            self.decode_bound = True
        self.step_token[0, 0], self.step_position[0] = token, position
        raw = getattr(self.binding, "_iobinding", None)
        if raw is not None and hasattr(self.session, "_sess"):
            self.session._sess.run_with_iobinding(raw, None)
        else:
            self.session.run_with_iobinding(self.binding)
        if self.step_taps:
            self.tap_values = {name: a[0].copy() for name, a in self.step_taps.items()}
        return self.step_logits[0, 0].copy()

    def run(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """tokens i64 [1, T], positions i64 [T] (= P..P+T-1) -> logits f32 [1, T, V]."""
        end = int(positions[-1]) + 1
        if end > self.capacity:
            self._grow(min(max(2 * self.capacity, end), self.limit), int(positions[0]))
        if tokens.shape[1] == 1:
            return self.step(int(tokens[0, 0]), int(positions[0]))[None, None]
        self.decode_bound = False
        self.binding.bind_output("logits")  # unallocated: ORT sizes it for this T
        for name in self.taps:
            self.binding.bind_output(name)
        self.binding.bind_cpu_input("tokens", tokens)
        self.binding.bind_cpu_input("positions", positions)
        self.session.run_with_iobinding(self.binding)
        outputs = self.binding.get_outputs()
        if self.taps:  # rebinding a name keeps its place: the taps are the last outputs
            self.tap_values = {name: np.array(v.numpy()[0]) for name, v in
                               zip(self.taps, outputs[-len(self.taps):])}
        return np.array(outputs[0].numpy())
