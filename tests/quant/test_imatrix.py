"""llama.cpp importance matrices: our files against gguf-py and llama.cpp's own reader's rules,
the collected statistic against an independent computation, and RTN's use of it.

The layouts are llama.cpp's as vendored by llama-cpp-python 0.3.36 (vendor/llama.cpp):
- tools/imatrix/imatrix.cpp `save_imatrix` (l. 603-629): general.type = "imatrix",
  imatrix.datasets (string array), imatrix.chunk_count / imatrix.chunk_size (u32); per weight,
  sorted, `<name>.in_sum2` F32 ne [n_in, n_mat] and `<name>.counts` F32 ne [1, n_mat].
- common/imatrix-loader.cpp `common_imatrix_load` (l. 101-170): the three keys make
  `has_metadata`; tensors are paired by the suffixes; both must be F32; counts are lround'ed.
- tools/quantize/quantize.cpp `load_imatrix` (l. 190-216): a GGUF imatrix without the three keys
  is refused ("missing imatrix metadata"); the weight used is in_sum2 / counts (1 for count 0).
- save_imatrix_legacy (l. 432-507): the .dat layout, values (Σx² / count) · ncall.

The llama.cpp consumer test (slow) needs llama-quantize and llama-imatrix built from that tree:

    pip download llama-cpp-python==0.3.36 --no-binary :all: --no-deps && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -DLLAMA_BUILD_TOOLS=ON \\
        -DLLAMA_BUILD_COMMON=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release \\
        -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX"   # as backends/gguf/llamacpp_build.py
    cmake --build build -j1 --target llama-quantize llama-imatrix      # ~25 min on 2 cores
    ARKINFER_LLAMA_TOOLS=$PWD/build/bin python -m pytest -m heavy tests/quant/test_imatrix.py
"""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from arkinfer.quant import QuantRecipe
from arkinfer.quant.calib.block import LINEARS
from arkinfer.quant.calib.imatrix_collect import collect_imatrix
from arkinfer.quant.calib.stream import block_file, load_weights
from arkinfer.quant.calib.weight_only import quantize_weight_only
from arkinfer.quant.calib_data import calibration_from_ids
from arkinfer.quant.imatrix import (
    Imatrix,
    ImatrixEntry,
    ImatrixError,
    gguf_weight_name,
    read_imatrix,
    write_imatrix,
)

from arkinfer.models.configs import tiny_config
from arkinfer.testing.synthetic import write_checkpoint

gguf = pytest.importorskip("gguf")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors on a shared machine: one intra-op thread (tests/conftest.py)."""


def random_imatrix(names: dict[str, int], seed: int = 0) -> Imatrix:
    rng = np.random.default_rng(seed)
    entries = {n: ImatrixEntry(rng.uniform(0.1, 50.0, (1, k)),
                               np.array([float(rng.integers(1, 5000))])) for n, k in names.items()}
    return Imatrix(entries, ["calib.txt", "more.txt"], 7, 512)


def tiny_names(n_layers: int = 2, hidden: int = 128, inter: int = 256) -> dict[str, int]:
    ins = {"mlp.down_proj": inter}
    return {gguf_weight_name(f"model.layers.{i}.{n}"): ins.get(n, hidden)
            for i in range(n_layers) for n in LINEARS}


# ------------------------------------------------------------------------------ file layouts
def test_gguf_round_trip(tmp_path):
    im = random_imatrix(tiny_names())
    back = read_imatrix(write_imatrix(tmp_path / "i.gguf", im))
    assert not back.legacy and back.datasets == im.datasets
    assert (back.chunk_count, back.chunk_size) == (7, 512)
    assert sorted(back.entries) == sorted(im.entries)
    for name, e in im.entries.items():
        np.testing.assert_array_equal(back.entries[name].sums, e.sums.astype(np.float32))
        np.testing.assert_array_equal(back.entries[name].counts, e.counts)


def test_dat_round_trip_keeps_the_mean_square(tmp_path):
    im = random_imatrix(tiny_names())
    back = read_imatrix(write_imatrix(tmp_path / "i.dat", im))
    assert back.legacy and back.datasets == ["more.txt"] and back.chunk_count == 7
    for name, e in im.entries.items():
        got = back.entries[name]
        # stored as (sum / count) * ncall with ncall = ceil(count / chunk_size)
        assert got.counts[0] == max(1, -(-int(e.counts[0]) // 512))
        np.testing.assert_allclose(got.mean_square(), e.mean_square(), rtol=1e-6)


def test_gguf_file_is_what_llama_cpp_reads(tmp_path):
    """gguf-py's reader sees exactly the keys, types, names and shapes of save_imatrix."""
    im = random_imatrix(tiny_names())
    path = write_imatrix(tmp_path / "i.gguf", im)
    reader = gguf.GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == ["general.type", gguf.Keys.IMatrix.DATASETS,
                            gguf.Keys.IMatrix.CHUNK_COUNT, gguf.Keys.IMatrix.CHUNK_SIZE]
    T = gguf.GGUFValueType
    assert fields["general.type"].contents() == "imatrix"
    assert fields["imatrix.datasets"].types == [T.ARRAY, T.STRING]
    assert fields["imatrix.datasets"].contents() == ["calib.txt", "more.txt"]
    assert fields["imatrix.chunk_count"].types == [T.UINT32]
    assert fields["imatrix.chunk_size"].types == [T.UINT32]
    assert (fields["imatrix.chunk_count"].contents(), fields["imatrix.chunk_size"].contents()) \
        == (7, 512)
    expected = [f"{n}{s}" for n in sorted(im.entries) for s in (".in_sum2", ".counts")]
    assert [t.name for t in reader.tensors] == expected
    for t in reader.tensors:
        name, kind = t.name.rsplit(".", 1)
        e = im.entries[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape) == ([e.n_in, 1] if kind == "in_sum2" else [1, 1])  # ne order
        want = e.sums if kind == "in_sum2" else e.counts[None, :]
        np.testing.assert_array_equal(t.data, want.astype(np.float32))
    for t in reader.tensors:  # ggml reads each tensor's padded size: the file holds all of it
        assert t.data_offset % 32 == 0
    last = reader.tensors[-1]
    assert path.stat().st_size >= last.data_offset + -(-last.n_bytes // 32) * 32


def test_reads_an_imatrix_written_by_gguf_py(tmp_path):
    """An imatrix from an independent writer (gguf-py, with general.architecture as its writer
    always adds; per-expert rows for a MoE weight) reads back; the MoE weight is refused on use."""
    path = tmp_path / "py.gguf"
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_type(gguf.GGUFType.IMATRIX)
    w.add_array(gguf.Keys.IMatrix.DATASETS, ["wiki.txt"])
    w.add_uint32(gguf.Keys.IMatrix.CHUNK_COUNT, 3)
    w.add_uint32(gguf.Keys.IMatrix.CHUNK_SIZE, 128)
    sums = np.arange(1, 129, dtype=np.float32)[None, :]
    w.add_tensor("blk.0.attn_q.weight.in_sum2", sums)
    w.add_tensor("blk.0.attn_q.weight.counts", np.array([[4.0]], dtype=np.float32))
    experts = np.ones((4, 128), dtype=np.float32)
    w.add_tensor("blk.0.ffn_up_exps.weight.in_sum2", experts)
    w.add_tensor("blk.0.ffn_up_exps.weight.counts", np.array([[1.0], [2.0], [0.0], [3.0]],
                                                             dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    im = read_imatrix(path)
    assert im.datasets == ["wiki.txt"] and (im.chunk_count, im.chunk_size) == (3, 128)
    imp = im.importance("model.layers.0.self_attn.q_proj", 128)
    np.testing.assert_allclose(imp.numpy(), np.arange(1, 129) / 4.0)
    moe = im.entries["blk.0.ffn_up_exps.weight"]
    assert moe.n_mat == 4
    np.testing.assert_allclose(moe.mean_square()[:, 0], [1.0, 0.5, 1.0, 1 / 3], rtol=1e-6)
    im.entries["blk.0.ffn_up.weight"] = moe
    with pytest.raises(ImatrixError, match="4 experts"):
        im.importance("model.layers.0.mlp.up_proj", 128)


def test_reads_a_legacy_file_laid_out_by_hand(tmp_path):
    """The .dat layout written byte by byte from save_imatrix_legacy (independent of encode_dat)."""
    name = b"blk.1.ffn_down.weight"
    values = np.array([2.0, 4.0, 6.0], dtype="<f4")
    raw = struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 2, 3) \
        + values.tobytes() + struct.pack("<ii", 5, 8) + b"data.txt"
    (tmp_path / "x.dat").write_bytes(raw)
    im = read_imatrix(tmp_path / "x.dat")
    assert im.legacy and im.chunk_count == 5 and im.datasets == ["data.txt"]
    np.testing.assert_allclose(im.importance("model.layers.1.mlp.down_proj", 3).numpy(),
                               [1.0, 2.0, 3.0])  # llama-quantize divides by ncall = 2


# ------------------------------------------------------------------------------------ errors
def test_bad_files_give_clear_errors(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("this is not an importance matrix at all\n" * 4)
    with pytest.raises(ImatrixError, match="neither a GGUF imatrix nor a legacy .dat"):
        read_imatrix(text)
    model = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(model, arch="llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ImatrixError, match=r"is a GGUF model \(general.architecture=llama\)"):
        read_imatrix(model)
    good = write_imatrix(tmp_path / "i.gguf", random_imatrix(tiny_names()))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:-200])
    with pytest.raises(ImatrixError, match="truncated"):
        read_imatrix(cut)
    with pytest.raises(ImatrixError, match="does not exist"):
        read_imatrix(tmp_path / "missing.gguf")


def test_length_mismatch_and_foreign_model_are_errors(tmp_path):
    im = read_imatrix(write_imatrix(tmp_path / "i.gguf", random_imatrix(tiny_names())))
    with pytest.raises(ImatrixError, match=r"has 128 values but the layer has in_features=576"):
        im.importance("model.layers.0.self_attn.q_proj", 576)
    with pytest.raises(ImatrixError, match=r"no entry for any of the 2 linears"):
        im.match({"model.layers.7.mlp.up_proj": 128, "model.layers.8.mlp.up_proj": 128})
    m = im.match({"model.layers.0.mlp.up_proj": 128, "model.layers.5.mlp.up_proj": 128,
                  "lm_head": 128})
    assert list(m.importance) == ["model.layers.0.mlp.up_proj"]
    assert m.missing == ["model.layers.5.mlp.up_proj", "lm_head"]
    assert "no entry for 2 (model.layers.5.mlp.up_proj, lm_head)" in m.describe()


def test_existing_output_needs_force(tmp_path):
    im = random_imatrix(tiny_names())
    path = write_imatrix(tmp_path / "i.gguf", im)
    with pytest.raises(ImatrixError, match="already exists.*\n.*--force"):
        write_imatrix(path, im)
    write_imatrix(path, im, force=True)
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(ImatrixError, match="not a regular file"):
        write_imatrix(tmp_path / "dir.gguf", im, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.gguf", "i.gguf"]  # no temp left


# --------------------------------------------------------------------------- the statistic
def test_collected_sums_equal_an_independent_forward(tiny_checkpoint):
    """Σx² and token counts of every linear's input, against Hugging Face transformers' Llama run
    on the same checkpoint, hooked, summed in numpy over the unpadded tokens."""
    transformers = pytest.importorskip("transformers")
    folder = tiny_checkpoint("llama")
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 512, (5, 24), generator=gen)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 15:] = False  # right padding: causal attention keeps it out of the real tokens
    mask[4, 6:] = False
    im = collect_imatrix(folder, calibration_from_ids(ids, mask, source="ids"), batch=2)
    assert im.datasets == ["ids"] and im.chunk_size == 24
    assert im.chunk_count == int(mask.sum()) // 24

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    seen: dict[str, list[np.ndarray]] = {}
    hooks = [mod.register_forward_pre_hook(
        lambda _m, args, _n=name: seen.setdefault(_n, []).append(args[0].detach().numpy()))
        for name, mod in model.named_modules() if name.split(".")[-1] in
        {n.split(".")[-1] for n in LINEARS} and ".layers." in name]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    keep = mask.numpy()
    assert len(seen) == 2 * len(LINEARS)
    for name, xs in seen.items():
        x = np.concatenate(xs).astype(np.float64)[keep]            # [kept tokens, in]
        entry = im.entries[gguf_weight_name(name)]
        assert entry.counts.tolist() == [float(keep.sum())]
        np.testing.assert_allclose(entry.sums[0], (x ** 2).sum(axis=0), rtol=2e-4, atol=1e-6)


# --------------------------------------------------------------------------------- RTN use
def _rtn_codes(folder: Path, work: Path, recipe: QuantRecipe, imatrix: Path | None) -> dict:
    options = {} if imatrix is None else {"imatrix": str(imatrix)}
    quantize_weight_only(folder, recipe, work, options=options)
    out = {}
    for i in range(2):
        quantized, _, _ = load_weights(block_file(work, i))
        out.update(quantized)
    return out


def test_rtn_with_an_all_ones_imatrix_equals_rtn_without(tiny_checkpoint, tmp_path):
    folder = tiny_checkpoint("llama")
    names = tiny_names()
    ones = Imatrix({n: ImatrixEntry(np.full((1, k), 37.0), np.array([37.0]))
                    for n, k in names.items()}, ["x"], 1, 37)
    path = write_imatrix(tmp_path / "ones.gguf", ones)
    recipe = QuantRecipe("rtn", "gguf-q4_0", bits=4, group_size=32)
    plain = _rtn_codes(folder, tmp_path / "a", recipe, None)
    weighted = _rtn_codes(folder, tmp_path / "b", recipe, path)
    assert sorted(plain) == sorted(weighted) and len(plain) == 14
    for name, qw in plain.items():
        assert torch.equal(qw.codes, weighted[name].codes), name
        assert torch.equal(qw.scales, weighted[name].scales), name


def test_rtn_imatrix_lowers_the_weighted_error(tiny_checkpoint, tmp_path):
    """A skewed importance moves the scale search towards the heavy columns: the error weighted
    by it drops (summed over the model), and layers the file lacks are quantised as without."""
    from arkinfer.frontend.checkpoint import open_checkpoint

    folder = tiny_checkpoint("llama")
    names = tiny_names()
    rng = np.random.default_rng(1)
    entries = {n: ImatrixEntry(rng.lognormal(0, 2, (1, k)), np.array([1.0]))
               for n, k in names.items() if not n.startswith("blk.1.ffn_down")}
    path = write_imatrix(tmp_path / "skew.gguf", Imatrix(entries, ["x"], 1, 1))
    recipe = QuantRecipe("rtn", "gguf-q4_0", bits=4, group_size=32)
    plain = _rtn_codes(folder, tmp_path / "a", recipe, None)
    weighted = _rtn_codes(folder, tmp_path / "b", recipe, path)
    weights = open_checkpoint(folder, with_tokenizer=False).weights
    err_plain = err_weighted = 0.0
    for name, qw in plain.items():
        gname = gguf_weight_name(name)
        if gname not in entries:
            assert torch.equal(qw.codes, weighted[name].codes)
            continue
        w = weights.get(name + ".weight").float()
        imp = torch.from_numpy(entries[gname].mean_square()[0])
        err_plain += float(((w - qw.dequantize()) ** 2 * imp).sum())
        err_weighted += float(((w - weighted[name].dequantize()) ** 2 * imp).sum())
    assert err_weighted < 0.95 * err_plain


def test_rtn_imatrix_needs_the_mse_grid(tmp_path):
    from arkinfer.quant.calib.registry import config_for, handler_for

    path = write_imatrix(tmp_path / "i.gguf", random_imatrix(tiny_names()))
    recipe = QuantRecipe("rtn", "gguf-q4_0", bits=4, group_size=32, grid="ggml")
    with pytest.raises(ImatrixError, match="ggml grid takes no importance"):
        handler_for(config_for(recipe, imatrix=str(path)))


# ------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    import typer
    from typer.testing import CliRunner

    from arkinfer.cli import quantize
    from arkinfer.frontend.demo import demo_model_path

    app = typer.Typer(pretty_exceptions_enable=False)
    app.command(name="quantize", help=quantize.HELP)(quantize.command)

    @app.callback()
    def _root() -> None:
        pass

    demo = demo_model_path()
    extra = {n: (demo / n).read_text() for n in ("tokenizer.json", "tokenizer_config.json")}
    model = write_checkpoint(tmp_path_factory.mktemp("tok"),
                             tiny_config("llama", vocab_size=2048), extra_files=extra)

    def invoke(*args):
        result = CliRunner().invoke(app, ["quantize", str(model), *map(str, args)])
        return result.exit_code, result.stdout + (result.stderr if result.stderr_bytes else "")

    return invoke


def test_cli_save_then_use_an_imatrix(cli, tmp_path):
    import json

    imat = tmp_path / "m.imatrix.gguf"
    code, out = cli("--method", "rtn", "--format", "gguf-q4_0", "--group-size", "32",
                    "--samples", "3", "--seq-len", "32", "-o", tmp_path / "a",
                    "--save-imatrix", imat, "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["imatrix"]["path"] == str(imat) and data["imatrix"]["linears"] == 14
    assert 0 < data["imatrix"]["tokens"] <= 3 * 32
    assert data["calibration"]["samples"] == 0  # RTN stays weight-only; only the imatrix ran
    assert len(read_imatrix(imat).entries) == 14
    code, out = cli("--method", "gptq", "--samples", "2", "--seq-len", "16", "-o", tmp_path / "b",
                    "--save-imatrix", imat)
    assert code != 0 and "already exists" in out and "--force" in out
    code, out = cli("--preset", "q4_0", "--group-size", "32", "-o", tmp_path / "c",
                    "--imatrix", imat, "--json")
    assert code == 0, out
    assert json.loads(out)["recipe"].startswith("rtn 4-bit g32")
    code, out = cli("--method", "gptq", "-o", tmp_path / "d", "--imatrix", imat)
    assert code != 0 and "--imatrix applies to RTN" in out


# ---------------------------------------------------------------- llama.cpp's own tools
TOOLS = os.environ.get("ARKINFER_LLAMA_TOOLS")


def _tool(name: str) -> Path:
    path = Path(TOOLS or "") / name
    if not TOOLS or not path.is_file():
        pytest.skip(f"set ARKINFER_LLAMA_TOOLS to a folder holding {name} (module docstring)")
    return path


def _run(*args) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.heavy
@pytest.mark.llamacpp
def test_llama_cpp_tools_take_our_imatrix_and_we_read_theirs(tmp_path):
    """llama-quantize quantises with our imatrix (every linear found, the result differs from
    quantising without), and llama-imatrix's own GGUF and .dat outputs read back here with the
    mean squares our collector measures on the same tokens."""
    quantize_bin, imatrix_bin = _tool("llama-quantize"), _tool("llama-imatrix")
    pytest.importorskip("llama_cpp")
    from arkinfer.backends.gguf.backend import BACKEND
    from llama_cpp import Llama

    from arkinfer.backend import LowerRequest
    from arkinfer.frontend.demo import demo_model_path

    demo = demo_model_path()
    extra = {n: (demo / n).read_text() for n in ("tokenizer.json", "tokenizer_config.json")}
    # 256-wide rows: IQ4_XS and the K-quants take only whole 256-value super-blocks
    cfg = tiny_config("llama", vocab_size=2048, hidden_size=256, intermediate_size=512)
    folder = write_checkpoint(tmp_path / "hf", cfg, extra_files=extra)
    BACKEND.lower(LowerRequest(folder, folder, None, "f32", None, tmp_path / "art", options={}))
    model = tmp_path / "art" / "model.gguf"

    # their tokens: the text as llama-imatrix splits it (BOS first in every chunk of n_ctx)
    n_ctx, n_chunks = 64, 4
    text = (Path(__file__).parents[2] / "arkinfer" / "data" / "corpus_train.txt").read_text()
    (tmp_path / "text.txt").write_text(text)
    vocab = Llama(str(model), vocab_only=True, verbose=False)
    tokens = vocab.tokenize(text.encode(), add_bos=True, special=False)
    assert len(tokens) >= 2 * n_ctx * n_chunks
    ids = torch.tensor(tokens[:n_ctx * n_chunks]).reshape(n_chunks, n_ctx)
    if tokens[0] == vocab.token_bos():  # the tokenizer adds BOS: llama-imatrix puts one per chunk
        ids[:, 0] = vocab.token_bos()

    ours = collect_imatrix(folder, calibration_from_ids(ids, source="text.txt"))
    write_imatrix(tmp_path / "ours.gguf", ours)
    write_imatrix(tmp_path / "ours.dat", ours)
    for ftype in ("Q4_K_M", "IQ4_XS"):
        for imat in ("ours.gguf", "ours.dat"):
            log = _run(quantize_bin, "--imatrix", tmp_path / imat, model,
                       tmp_path / f"{ftype}-{imat.replace('.', '_')}.gguf", ftype, "1")
            assert "loaded 14 importance matrix entries" in log, log[-2000:]
            assert "did not find weights for blk" not in log and "imatrix size" not in log
    _run(quantize_bin, model, tmp_path / "plain.gguf", "Q4_K_M", "1")
    plain = {t.name: bytes(t.data) for t in gguf.GGUFReader(tmp_path / "plain.gguf").tensors}
    used = {t.name: bytes(t.data)
            for t in gguf.GGUFReader(tmp_path / "Q4_K_M-ours_gguf.gguf").tensors}
    assert sum(plain[n] != used[n] for n in plain if n.startswith("blk.")) >= 7

    for fmt, out in (("gguf", "theirs.gguf"), ("dat", "theirs.dat")):
        _run(imatrix_bin, "-m", model, "-f", tmp_path / "text.txt", "-o", tmp_path / out,
             "-c", n_ctx, "-b", n_ctx, "--chunks", n_chunks, "--no-ppl", "-t", 1,
             "-ctk", "f32", "-ctv", "f32", "--output-format", fmt)  # an f16 cache would round
    theirs, legacy = read_imatrix(tmp_path / "theirs.gguf"), read_imatrix(tmp_path / "theirs.dat")
    assert theirs.chunk_count == n_chunks and theirs.chunk_size == n_ctx and legacy.legacy
    assert sorted(theirs.entries) == sorted(ours.entries) == sorted(legacy.entries)
    for name, e in theirs.entries.items():
        assert e.counts.tolist() == [n_ctx * n_chunks], name
        mine = ours.entries[name].mean_square()
        # float32 in both, summed in other orders (measured: at most 1.3e-3 apart)
        np.testing.assert_allclose(e.mean_square(), mine, rtol=5e-3, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(legacy.entries[name].mean_square(), e.mean_square(),
                                   rtol=1e-5, err_msg=name)
