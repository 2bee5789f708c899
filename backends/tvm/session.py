"""Drive a compiled module: a KV cache held on a TVM device, grown by one `step` per call.

    s = TVMSession(executable, tvm.cpu(), params, signature)   # or an RPC session's device
    last = s.step([1, 5, 9])[-1]         # prefill: numpy float32 [V], the last token's logits
    last = s.step([42])[-1]              # decode (the "decode" entry when the module has one)
    s.reset(); rows = s.step([1, 5, 9])  # a window: [T, V] from an empty cache

`TVMRunner` wraps it as a `StepRunner` (its `_step` is `step`; StepRunner supplies prefill,
decode and window_logits); `rpc_bench` drives it directly over TVM RPC, where no Runner exists.

`executable`: a relax VMExecutable (`compile.build(...).host_exec`) or a loaded runtime module
(`tvm.runtime.load_module(host.so)`, or an RPC session's uploaded module). `params`: name ->
numpy array (or tvm tensors) for every name of `signature.params` (compile.Build.params, or the
artifact's params.safetensors). The cache is functional like the IR's: each call returns the
grown cache, which the session keeps on the device (no host round trip).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.rpc.base import RPC_SESS_MASK

from arkinfer.backend import check_token_ids
from arkinfer.errors import ArkError

from .lower_relax import Signature


class TVMSession:
    def __init__(self, executable_or_module: Any, device: Any, params: Mapping[str, Any],
                 signature: Signature) -> None:
        self.vm = relax.VirtualMachine(executable_or_module, device)
        self.device, self.sig = device, signature
        missing = [p for p in signature.params if p not in params]
        if missing:
            raise ArkError(f"params lack {len(missing)} tensor(s) the module takes, e.g. "
                           f"{missing[0]!r}", hint="load params.safetensors of the same artifact")
        self.params = [params[p] if isinstance(params[p], tvm.runtime.Tensor)
                       else tvm.runtime.tensor(np.ascontiguousarray(params[p]), device)
                       for p in signature.params]
        self.vocab_size = signature.vocab_size
        # In this process the entries are called directly: one FFI call converts the arguments
        # in C and returns the outputs as one array, where set_input converts each of the ~550
        # arguments in Python and get_outputs fetches each output with two more calls (a
        # SmolLM2 decode step 10.6 against 11.3 ms; benchmarks/tvm_decode_parts.py). Over RPC a
        # remote tuple result is an opaque handle, so remote sessions keep the stateful calls.
        remote = device.dlpack_device_type() >= RPC_SESS_MASK
        self._entries = None if remote else {e: self.vm.module[e] for e in signature.entries}
        self.reset()

    def reset(self) -> None:
        """Empty the KV cache."""
        c = self.sig.cache
        empty = np.zeros((1, c["kv_heads"], 0, c["head_dim"]), np.float32)
        self.cache = [tvm.runtime.tensor(empty, self.device) for _ in range(2 * c["layers"])]
        self.length = 0

    def step(self, ids: Sequence[int]) -> np.ndarray:
        """Append `ids` to the cache; float32 logits [len(ids), V]."""
        check_token_ids(ids, self.vocab_size, cached=self.length,
                        max_positions=self.sig.cache["max_len"])
        entry = "decode" if len(ids) == 1 and "decode" in self.sig.entries else "prefill"
        tokens = tvm.runtime.tensor(np.asarray([ids], np.int64), self.device)
        positions = tvm.runtime.tensor(np.arange(self.length, self.length + len(ids),
                                                 dtype=np.int64), self.device)
        if self._entries is not None:
            out = self._entries[entry](tokens, positions, *self.cache, *self.params)
        else:  # stateful call: its outputs are fetched one by one, which works over TVM RPC
            self.vm.set_input(entry, tokens, positions, *self.cache, *self.params)
            self.vm.invoke_stateful(entry)
            out = self.vm.get_outputs(entry)
        self.cache = list(out[1:])
        self.length += len(ids)
        return out[0].numpy()[0]
