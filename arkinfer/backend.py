"""The backend contract and registry: everything the pipeline asks of a backend, declared here.

A backend is an object registered in the `arkinfer.backends` entry-point group, e.g. in a third
party's pyproject.toml:

    [project.entry-points."arkinfer.backends"]
    mybackend = "my_package.backend:BACKEND"

Entry points are imported only when a backend is asked for by name, so listing backends never
imports a backend SDK.

**Writing a backend.** Subclass `BackendBase` (it supplies the defaults) and implement:

    name: str                                  # the registry name, e.g. "gguf"
    capabilities: Capabilities                 # what it can do, declared once (below): formats,
        # bits, act-order, the IR ops it lowers, dtypes, attention modes, optional runtime,
        # packages, remote bench. resolve, plan, preflight, build and doctor ask it; a target
        # profile only narrows it.
    available() -> bool                        # every toolchain importable here
    install_hint() -> str                      # the command that makes available() true
    preflight(raw_config, recipe, target, dtype) -> list[str]
        # config.json only, before any weight is read: RAISE an ArkError (TargetError) when the
        # build is impossible (architecture, format, shapes, device capability); RETURN notes
        # the user should read. Default: no notes.
    lower(request: LowerRequest) -> LowerResult   # write the artifact's files into out_dir
    load(artifact_dir, manifest, *, bench=False) -> Runner
        # run the artifact on this machine; bench=True may return a runner tuned for timing
    reference_weights(artifact_dir) -> Path | None
        # a folder or GGUF ArkInfer's reference model can run to reproduce the artifact's exact
        # (quantised) weights: verify then checks runtime fidelity on the same weights, gated
        # at `fidelity_top1` top-1 agreement. Default None (no fidelity check).
    ir_passes: tuple[str, ...]                 # IR passes (arkinfer.ir.PASSES) to run on the
                                               # program before lower; the manifest records them
    lowers_from_ir: bool                       # default True; False when lower() reads only the
                                               # weights (gguf): build then skips the trace
    bench_remote(artifact_dir, manifest, address, key, spec, progress) -> rows
        # `arkinfer bench --rpc HOST:PORT [--key K]`: llama-bench rows measured on a remote device
        # (tvm: TVM RPC; it declares `remote_bench=True`). Default: an ArkError saying this
        # backend has no remote bench.
    build_runtime(progress) -> dict[str, str]
        # `arkinfer doctor --build-FLAG`: build (or reuse) the optional native runtime its
        # capabilities declare (`Capabilities.runtime`, FLAG its `flag`), which the Runner then
        # uses (gguf: llama.cpp patched with InfLLM v2); returns what to show (versions,
        # paths). Default: an ArkError saying there is none.
    quantizes_in_lower(recipe, options) -> bool
        # default False; True when lower() quantises this weight-only recipe itself from the
        # float source with the runtime's own quantiser (gguf's rtn=ggml, the bytes
        # llama-quantize writes): build then skips its quantise stage, passes the float
        # checkpoint as model_dir, and takes the manifest's quant figures from LowerResult.quant
    fidelity_top1: float                       # default 0.99
    options: Mapping[str, BackendOption]      # every `--option KEY=VALUE` the backend takes:
        # KEY -> what it does and, for a fixed set, the allowed values. Default {} (none).
        # `check_backend_options` (plan time, before any work) refuses an unknown or empty KEY
        # and a value outside `choices`, naming the declared keys and a valid example.
    check_options(options) -> None
        # raise ArkError for a value `options` cannot declare (a number, a list), at plan time,
        # after the declared keys and choices passed. Default: nothing more to check.

A `Runner` (below) serves verify, eval and bench; `RunnerBase` supplies `attention_modes = ()`
(the runner cannot switch between dense and sparse attention), `fixed_attention = None`,
`deferred = ()` (every check ran here) and a refusing `set_attention`.

Speculative decoding (`arkinfer.speculative`) needs two more calls, optional: `extend(ids)` ->
logits [len(ids), V] of every appended position, and `truncate(n)`, which keeps the first n cached
positions. A runner that has both sets `speculates = True` (`SpeculativeRunner`); `RunnerBase`
says False and refuses both with the reason, so a runtime without them is named, never guessed.

`LowerRequest.model_dir` is a Hugging Face folder holding the weights to lower: the float source
checkpoint (`--quant f32/f16/bf16`) or the quantised folder written by `quant.export` in the
recipe's storage format (gptq / marlin / awq tensors, or ArkInfer's generic layout for the other
formats, e.g. the exact GGUF block bytes for `gguf-q4_0`). `quant.load` unpacks any of them.
`LowerRequest.program` is the traced IR after the backend's `ir_passes` (None when the backend
says `lowers_from_ir = False`: tracing costs seconds per layer, and a weights-only lowering such as
GGUF's does not read it).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import torch

from arkinfer.errors import ArkError, NotAvailableError

GROUP = "arkinfer.backends"


@dataclass(frozen=True)
class BackendOption:
    """One `--option KEY=VALUE` a backend takes (the backend's `options` maps KEY to this).

    help: what the value changes, in a few words.
    choices: the allowed values; empty for a free value (a number, a list) that the backend's
        `check_options` checks.
    example: a valid value for hints (default: the first choice).
    ignore_case: the backend reads the value lower-cased, so `Q8_0` counts as `q8_0`.
    """

    help: str
    choices: tuple[str, ...] = ()
    example: str = ""
    ignore_case: bool = False

    def example_value(self) -> str:
        return self.example or (self.choices[0] if self.choices else "VALUE")

    def describe(self, key: str) -> str:
        """`key=a|b|c (help)`, or `key=EXAMPLE (help)` for a free value."""
        return f"{key}={'|'.join(self.choices) or self.example_value()} ({self.help})"


FLOAT_DTYPES = ("f32", "f16", "bf16")  # float build dtypes (`--quant f32 / f16 / bf16`)
ATTENTION_MODES = ("dense", "infllmv2")


@dataclass(frozen=True)
class OptionalRuntime:
    """A native runtime a backend builds on request (`arkinfer doctor --build-FLAG` calls
    `Backend.build_runtime`) and its Runner then runs InfLLM v2 with.

    flag: the doctor option's suffix: "llamacpp" is `arkinfer doctor --build-llamacpp`.
    title: what doctor calls the build, e.g. "InfLLM v2 llama.cpp".
    built: the probe plan asks: True when a finished build is on this machine and the Runner
        will use it. Cheap and without side effects: it reads the build cache, never builds
        and never imports the runtime, so it can be asked at plan time.
    without: what the Runner runs while `built()` is False (plan's ops table prints it).
    """

    flag: str
    title: str
    built: Callable[[], bool]
    without: str


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared once as `Backend.capabilities`. resolve, plan, the
    preflights and doctor ask it; a target profile's `[backends.NAME]` only narrows it (a
    format a profile lists must be one the backend declares: tests/test_backend_capabilities.py).

    formats: registered quant format names (`arkinfer.quant.formats`) lower() stores.
    ops: the IR op kinds (`arkinfer.ir.ops.Op` values, e.g. "rms_norm") lower() takes. build
        refuses a traced program that uses another, naming the ops and the nodes
        (`arkinfer.lowering.program_ops.check_program_ops`). A backend that lowers from the
        weights (`lowers_from_ir = False`) declares the ops its lowering covers.
    bits: code widths its quantised linears take; () = every width its formats store.
    act_order: takes GPTQ act-order weights (desc_act=True: a permuting g_idx).
    dtypes: float build dtypes it lowers (FLOAT_DTYPES names).
    cache_dtypes: KV cache element types its Runner keeps.
    attention: attention its Runner runs (ATTENTION_MODES): "dense", and "infllmv2" when it runs
        a config's sparse_config (InfLLM v2 past dense_len).
    runtime: the optional runtime InfLLM v2 needs, or None when the Runner runs it as shipped;
        while the runtime is not built the Runner runs dense (`runs_infllmv2()` asks the probe).
    extra: the pip extra that installs its toolchain (`pip install 'arkinfer[EXTRA]'`); None
        when the core install is enough.
    packages: distribution -> what the backend uses it for (`arkinfer doctor` lists versions).
    remote_bench: `arkinfer bench --rpc` times its artifacts on a remote device
        (`Backend.bench_remote`).
    """

    formats: tuple[str, ...]
    ops: tuple[str, ...]
    bits: tuple[int, ...] = ()
    act_order: bool = False
    dtypes: tuple[str, ...] = FLOAT_DTYPES
    cache_dtypes: tuple[str, ...] = ("f32",)
    attention: tuple[str, ...] = ATTENTION_MODES
    runtime: OptionalRuntime | None = None
    extra: str | None = None
    packages: Mapping[str, str] = field(default_factory=dict, hash=False)
    remote_bench: bool = False

    def __post_init__(self) -> None:
        hint = "declare values from arkinfer/backend.py's FLOAT_DTYPES and ATTENTION_MODES"
        for what, values, allowed in (("dtypes", self.dtypes, FLOAT_DTYPES),
                                      ("cache_dtypes", self.cache_dtypes, FLOAT_DTYPES),
                                      ("attention", self.attention, ATTENTION_MODES)):
            bad = [v for v in values if v not in allowed]
            if bad or not values:
                raise ArkError(f"Capabilities.{what}={values!r}: {bad or 'empty'} (allowed: "
                               f"{', '.join(allowed)})", hint=hint)
        if "dense" not in self.attention:
            raise ArkError(f"Capabilities.attention={self.attention!r} lacks 'dense' (a config "
                           "without sparse_config runs dense everywhere)", hint=hint)
        if not self.ops or len(set(self.ops)) != len(self.ops):
            raise ArkError(f"Capabilities.ops={self.ops!r}: empty or repeated",
                           hint="declare each IR op lower() takes once (arkinfer/ir/ops.py Op)")
        if self.runtime is not None and "infllmv2" not in self.attention:
            raise ArkError("Capabilities.runtime is set but attention has no 'infllmv2': the "
                           "runtime exists to run InfLLM v2", hint="add 'infllmv2' to attention")
        object.__setattr__(self, "packages", MappingProxyType(dict(self.packages)))

    def runs_infllmv2(self) -> bool:
        """True when the Runner runs InfLLM v2 on this machine now (asks the runtime's probe)."""
        return "infllmv2" in self.attention and (self.runtime is None or self.runtime.built())

    def dense_reason(self) -> str:
        """Why the Runner runs a sparse_config model dense here ('' when it does not)."""
        if self.runs_infllmv2():
            return ""
        if self.runtime is None:
            return "its runtime runs dense attention only"
        return (f"{self.runtime.without}; `arkinfer doctor --build-{self.runtime.flag}` builds "
                f"the {self.runtime.title}")


@dataclass
class LowerRequest:
    """What `Backend.lower` gets.

    model_dir: HF folder with the weights to lower (float source, or quantised in `recipe.format`).
    source_dir: the float source checkpoint (tokenizer files, original config).
    recipe: the quantisation recipe (`quant.recipe.QuantRecipe`), None for a float build.
    dtype: float dtype for unquantised tensors ("f32", "f16", "bf16").
    target: the `Target` profile; out_dir: the (temporary) artifact folder to write into.
    options: backend-specific options from the CLI (`--option key=value`).
    progress: call with a short message for long steps.
    program: the traced IR (`arkinfer.ir.Program`, fp32 types, shape-only: its weights live in
        model_dir), after the backend's `ir_passes`; None when the caller did not trace
        (backends then trace: `arkinfer.lowering.program.program_of`).
    """

    model_dir: Path
    source_dir: Path
    recipe: Any
    dtype: str
    target: Any
    out_dir: Path
    options: dict[str, str] = field(default_factory=dict)
    progress: Callable[[str], None] = lambda msg: None
    program: Any = None


@dataclass
class LowerResult:
    """What `Backend.lower` returns; all of it goes into the manifest.

    files: artifact-relative paths the backend wrote (the manifest hashes every file anyway).
    ops: op -> implementation this artifact uses, e.g. {"attention": "InfLLM v2 (arkinfer
        ONNX function)"} or {"attention": "dense (llama.cpp ignores arkinfer.sparse.*)"}.
    toolchain: package -> version used to write / run the artifact.
    notes: anything the user must know (type fallbacks, layers kept in float, ...).
    layers: per-tensor storage, e.g. {"model.layers.0.mlp.up_proj": "Q4_0"} (optional).
    quant: when lower() quantised the weights itself (`Backend.quantizes_in_lower`):
        {"bits_per_weight": float, "quantised_by": "who rounded the weights"}.
    """

    files: list[str]
    ops: dict[str, str] = field(default_factory=dict)
    toolchain: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    layers: dict[str, str] = field(default_factory=dict)
    quant: dict[str, Any] | None = None


@runtime_checkable
class Runner(Protocol):
    """An artifact running on this machine (verify, eval and bench use only this).

    Token ids are plain ints from the artifact's own tokenizer. Logits are float32 CPU tensors.
    """

    vocab_size: int
    attention_modes: tuple[str, ...]  # what set_attention accepts ("dense", "sparse"); () = none
    fixed_attention: str | None       # None: attention as the model's config says (InfLLM v2
                                      # past dense_len); "dense": the runtime always runs dense
                                      # (upstream llama.cpp), so verify compares with a dense
                                      # reference and says so
    deferred: tuple[str, ...]         # checks this runner could not run on this machine, one
                                      # sentence each (Core ML off macOS: runtime parity, since
                                      # a stand-in evaluator ran); verify records them. () = none

    def tokenize(self, text: str) -> list[int]:
        """Ids of `text` as the artifact's runtime tokenizes it (no BOS added)."""

    def window_logits(self, ids: list[int]) -> torch.Tensor:
        """Logits [T, V] of `ids` evaluated from an empty KV cache (cache is left holding them)."""

    def reset(self) -> None:
        """Empty the KV cache."""

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Append `ids` to the cache; logits [V] of the last one."""

    def decode(self, token: int) -> torch.Tensor:
        """Append one token; its logits [V]."""

    def set_attention(self, mode: str) -> None:
        """Switch attention to `mode` (one of `attention_modes`) for the following calls."""


@runtime_checkable
class SpeculativeRunner(Runner, Protocol):
    """A Runner whose KV cache can be extended with logits of every new position and cut back:
    what speculative decoding's verify step and its rollback after a rejected draft need."""

    speculates: bool  # True: extend() and truncate() work on this runner

    def extend(self, ids: list[int]) -> torch.Tensor:
        """Append `ids` to the cache; logits float32 [len(ids), V], row i that of ids[i]."""

    def truncate(self, n: int) -> None:
        """Keep the first `n` cached positions (0 <= n <= cached), drop the rest."""


class RunnerBase:
    """Defaults for runners: no attention switch, nothing deferred, no speculation."""

    attention_modes: tuple[str, ...] = ()
    fixed_attention: str | None = None
    deferred: tuple[str, ...] = ()
    speculates: bool = False
    # True: the runner's steps run on torch's thread pool (the reference model). Other runtimes
    # have threads of their own; torch work beside them (a draft head) then runs on one thread
    # (arkinfer.speculative.engine.torch_threads_beside)
    computes_in_torch: bool = False

    def extend(self, ids: list[int]) -> torch.Tensor:
        raise self._cannot_speculate("extend")

    def truncate(self, n: int) -> None:
        raise self._cannot_speculate("truncate")

    def _cannot_speculate(self, call: str) -> NotAvailableError:
        return NotAvailableError(
            f"{type(self).__name__} cannot {call} its KV cache, so it cannot run speculative "
            "decoding (the verify step extends the cache by a draft and truncates it after a "
            "rejection)", hint="decode without a draft, or use a runtime that speculates "
                               "(docs/speculative.md lists them)")

    def set_attention(self, mode: str) -> None:
        if mode not in self.attention_modes:
            raise NotAvailableError(
                f"this runtime cannot switch attention to {mode!r} (it runs "
                f"{', '.join(self.attention_modes) or 'one fixed attention'})",
                hint="leave attention at its default (e.g. --attention default)")


class StepRunner(RunnerBase):
    """A runner over a KV cache that one `_step` call extends: subclasses set `self.dir` (the
    artifact folder) and `self.tokenizer` (a `tokenizers.Tokenizer` or None) and implement
    `reset()` and `_step(ids, last_only)` -> logits float32 [len(ids), V] (or [1, V] when
    `last_only` and the runtime can skip the other rows); this supplies the rest of `Runner`."""

    dir: Path
    tokenizer: Any

    def _step(self, ids: list[int], last_only: bool) -> torch.Tensor:
        raise NotImplementedError

    def tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise NotAvailableError(f"{self.dir} has no tokenizer.json",
                                    hint="rebuild the artifact from a folder with a tokenizer")
        return self.tokenizer.encode(text, add_special_tokens=False)

    def window_logits(self, ids: list[int]) -> torch.Tensor:
        self.reset()
        return self._step(list(ids), last_only=False)

    def prefill(self, ids: list[int]) -> torch.Tensor:
        return self._step(list(ids), last_only=True)[-1]

    def decode(self, token: int) -> torch.Tensor:
        return self._step([int(token)], last_only=True)[-1]

    def extend(self, ids: list[int]) -> torch.Tensor:
        """Logits [len(ids), V] of every appended position; speculation also needs the
        subclass's `truncate` (it then sets `speculates = True`)."""
        return self._step([int(i) for i in ids], last_only=False)


def runner_context(runner, raw_config: dict[str, Any] | None) -> int | None:
    """The most tokens a bench may put in `runner`'s cache: the cache size the runner was loaded
    with where it has one (llama.cpp's `n_ctx`, onnxruntime's `max_positions`), never more than
    the source model's `max_position_embeddings` (`raw_config`, when the source is on this
    machine); None when neither is known."""
    sizes = [getattr(runner, "n_ctx", None), getattr(runner, "max_positions", None),
             (raw_config or {}).get("max_position_embeddings")]
    sizes = [s for s in sizes if isinstance(s, int) and not isinstance(s, bool) and s > 0]
    return min(sizes) if sizes else None


def check_token_ids(ids: Sequence[int], vocab_size: int, *, cached: int = 0,
                    max_positions: int | None = None,
                    length_hint: str = "reset() the runner or use a shorter prompt") -> None:
    """Raise ArkError unless `ids` (the token ids one step appends to a KV cache that holds
    `cached` tokens) is a non-empty run of ids in 0..vocab_size-1 that keeps the cache within
    `max_positions` tokens (None: no limit). `length_hint` tells the user how to lift that limit
    (a longer context, a reset); a runtime fed a bad id would index past its embedding table."""
    if len(ids) == 0:
        raise ArkError("no tokens to evaluate", hint="give at least one token id")
    bad = next((int(i) for i in ids if not 0 <= int(i) < vocab_size), None)
    if bad is not None:
        raise ArkError(f"token id {bad} is outside the vocabulary 0..{vocab_size - 1}",
                       hint="tokenize with the artifact's own tokenizer")
    if max_positions is not None and cached + len(ids) > max_positions:
        raise ArkError(f"{cached} cached + {len(ids)} new tokens exceed the context of "
                       f"{max_positions} positions", hint=length_hint)


@runtime_checkable
class Backend(Protocol):
    """Everything the pipeline uses of a backend (see the module docstring)."""

    name: str
    capabilities: Capabilities
    ir_passes: tuple[str, ...]
    lowers_from_ir: bool
    fidelity_top1: float
    options: Mapping[str, BackendOption]

    def available(self) -> bool:
        """True when every toolchain this backend needs on this machine is importable."""

    def install_hint(self) -> str:
        """The command that makes `available()` true (shown to users when it is not)."""

    def preflight(self, raw_config: dict[str, Any], recipe: Any, target: Any,
                  dtype: str) -> list[str]:
        """Raise when the build is impossible; else notes (config.json only, no weights)."""

    def lower(self, request: LowerRequest) -> LowerResult:
        """Write the artifact's files into `request.out_dir`."""

    def load(self, artifact_dir: str | Path, manifest: dict[str, Any] | None = None, *,
             bench: bool = False) -> Runner:
        """A Runner of the artifact on this machine (bench=True: tuned for timing)."""

    def reference_weights(self, artifact_dir: str | Path) -> Path | None:
        """Weights the reference model runs to reproduce the artifact exactly, or None."""

    def quantizes_in_lower(self, recipe: Any, options: dict[str, str]) -> bool:
        """True when lower() quantises this (weight-only) recipe from the float source itself."""

    def check_options(self, options: dict[str, str]) -> None:
        """Raise ArkError for a declared --option's free value this backend cannot take."""

    def build_runtime(self, progress: Callable[[str], None] | None = None) -> dict[str, str]:
        """Build (or reuse) `capabilities.runtime`; what doctor shows (versions, paths)."""

    def bench_remote(self, artifact_dir: str | Path, manifest: dict[str, Any], address: str,
                     key: str | None, spec: Any,
                     progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        """llama-bench rows of the artifact timed on a remote device (`bench --rpc`)."""


class BackendBase:
    """Defaults for the optional parts of the `Backend` contract (`capabilities` has none:
    every backend declares its own)."""

    name: str = ""
    ir_passes: tuple[str, ...] = ()
    lowers_from_ir: bool = True
    fidelity_top1: float = 0.99
    options: Mapping[str, BackendOption] = MappingProxyType({})

    def preflight(self, raw_config: dict[str, Any], recipe: Any, target: Any,
                  dtype: str) -> list[str]:
        return []

    def reference_weights(self, artifact_dir: str | Path) -> Path | None:
        return None

    def quantizes_in_lower(self, recipe: Any, options: dict[str, str]) -> bool:
        return False

    def check_options(self, options: dict[str, str]) -> None:
        return None

    def build_runtime(self, progress: Callable[[str], None] | None = None) -> dict[str, str]:
        raise NotAvailableError(f"backend {self.name!r} has no runtime to build",
                                hint="`arkinfer doctor --build-llamacpp` builds the gguf "
                                "backend's InfLLM v2 llama.cpp")

    def bench_remote(self, artifact_dir: str | Path, manifest: dict[str, Any], address: str,
                     key: str | None, spec: Any,
                     progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        raise NotAvailableError(f"backend {self.name!r} has no remote bench (--rpc)",
                                hint="--rpc times tvm artifacts (arkinfer build MODEL --target "
                                "android) on a TVM RPC server; bench this artifact without --rpc")


def _options_hint(backend: Backend, key: str | None = None) -> str:
    """The keys `backend` declares and one valid `--option` (of `key` when it is declared)."""
    declared = backend.options
    if not declared:
        return f"backend {backend.name!r} takes no --option; drop it"
    key = key if key in declared else next(iter(declared))
    keys = "; ".join(spec.describe(k) for k, spec in declared.items())
    return f"{backend.name} options: {keys}; e.g. --option {key}={declared[key].example_value()}"


def check_backend_options(backend: Backend,
                          given: Mapping[str, str] | Iterable[str] | None) -> dict[str, str]:
    """The `--option`s for `backend` as {KEY: VALUE}, checked against what it declares (plan time).

    `given` is a mapping, or the CLI's `KEY=VALUE` strings (KEY up to the first `=`; a later item
    with the same KEY wins). Raises ArkError for an item without `=`, an empty or undeclared KEY
    (naming the closest declared one) and a value outside the key's `choices`; every hint lists
    the declared keys with a valid example. Then `backend.check_options` checks free values."""
    if given is None:
        options: dict[str, str] = {}
    elif isinstance(given, Mapping):
        options = {str(k): str(v) for k, v in given.items()}
    else:
        options = {}
        for item in given:
            key, sep, value = item.partition("=")
            if not sep:
                raise ArkError(f"--option {item!r} is not KEY=VALUE", hint=_options_hint(backend))
            options[key] = value
    declared = backend.options
    for key, value in options.items():
        if not key.strip():
            raise ArkError(f"--option {key}={value!r} has an empty KEY",
                           hint=_options_hint(backend))
    unknown = [key for key in options if key not in declared]
    if unknown:
        lower = {k.lower(): k for k in declared}
        close = [lower[m] for m in difflib.get_close_matches(unknown[0].lower(), list(lower), n=1)]
        known = f"it takes {', '.join(declared)}" if declared else "it takes none"
        raise ArkError(f"unknown {backend.name} option(s) {unknown}: {known}"
                       + (f" (did you mean {close[0]!r}?)" if close else ""),
                       hint=_options_hint(backend, close[0] if close else None))
    for key, value in options.items():
        spec = declared[key]
        if spec.choices and (value.lower() if spec.ignore_case else value) not in spec.choices:
            raise ArkError(f"--option {key}={value!r} is not a {backend.name} choice (allowed "
                           f"{', '.join(spec.choices)})", hint=_options_hint(backend, key))
    backend.check_options(options)
    return options


@dataclass(frozen=True)
class BackendStatus:
    name: str
    available: bool
    install_hint: str


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def backend_names() -> list[str]:
    """Registered backend names (nothing is imported)."""
    return sorted(_entry_points())


def get_backend(name: str) -> Backend:
    """The backend registered as `name`, imported now; unknown names list the registered ones."""
    eps = _entry_points()
    if name not in eps:
        raise NotAvailableError(f"backend {name!r} is not registered",
                                hint=f"registered backends: {', '.join(sorted(eps)) or 'none'}; "
                                "a backend registers in the 'arkinfer.backends' entry-point group")
    backend = eps[name].load()
    if not isinstance(backend, Backend):
        missing = [m for m in ("name", "capabilities", "ir_passes", "lowers_from_ir",
                               "fidelity_top1", "available", "install_hint", "preflight", "lower",
                               "load", "reference_weights", "quantizes_in_lower", "check_options",
                               "options", "build_runtime", "bench_remote")
                   if not hasattr(backend, m)]
        raise NotAvailableError(f"entry point {eps[name].value!r} of backend {name!r} does not "
                                f"implement the Backend contract (missing: {', '.join(missing)})",
                                hint="subclass arkinfer.backend.BackendBase and implement the "
                                "members arkinfer/backend.py lists")
    return backend


def backend_status() -> list[BackendStatus]:
    """Every registered backend with whether it is usable here and how to install it."""
    out = []
    for name in backend_names():
        backend = get_backend(name)
        out.append(BackendStatus(name, backend.available(), backend.install_hint()))
    return out
