"""Every input bounded before it is read or allocated (issue 37, item 3 and the plot of item 7).

Reproductions from the campaign: `eval --text big50.txt --max-windows 1` tokenised the whole
50 MB file first (~185 bytes of RSS per input byte); `targets show /dev/zero`, `plan --target
/dev/zero` and `build --target /dev/urandom` read until MemoryError, `--target FIFO` hung;
`--calib FIFO` / `--calib /dev/zero` said "does not exist"; `bench -p 99999999999999999999`
doubled a list to 4 GB, `-r` / `--warmup 99999999999` and `--threads 100000` were accepted;
`bench --plot /dev/full` wrote `/dev/full.png`, `--plot .` wrote `./.png`. Cases that read a
device or open a FIFO run in a forked child under a memory cap and a time limit (`run_bounded`
of the parser fuzz suite), so the old behaviour fails the case, not the machine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from test_fuzz_inputs import run_bounded  # forked child: RLIMIT_AS + 2 GiB, 20 s
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.errors import ArkError
from arkinfer.frontend.demo import demo_model_path
from arkinfer.frontend.tokenizer import load_tokenizer
from arkinfer.paths import read_json_object, read_limited

DATA = Path(__file__).resolve().parents[2] / "arkinfer" / "data"
CORPORA = [DATA / "corpus_eval.txt", DATA / "corpus_train.txt"]


def invoke(*args: str) -> dict:
    """The CLI in this process (one thread: this may run in a forked child)."""
    import torch

    torch.set_num_threads(1)
    res = CliRunner().invoke(app, [str(a) for a in args])
    return {"exit_code": res.exit_code, "output": res.output,
            "stray": None if res.exception is None or isinstance(res.exception, SystemExit)
            else repr(res.exception)}


def one_error(result: dict, *needles: str) -> str:
    """Exactly one `error:` and a `hint:`, no traceback, and every needle in the output."""
    out = result["output"]
    assert result["exit_code"] == 1 and result["stray"] is None, out + str(result["stray"])
    assert "Traceback" not in out and "this is a bug" not in out, out
    lines = out.splitlines()
    assert sum(line.startswith("error:") for line in lines) == 1, out
    assert any(line.startswith("hint:") for line in lines), out
    for needle in needles:
        assert needle in " ".join(out.split()), f"{needle!r} not in {out}"
    return out


@pytest.fixture
def special(tmp_path):
    """name -> (path, what the error must call it): things that are not regular files."""
    os.mkfifo(tmp_path / "efifo.toml")
    (tmp_path / "folder.toml").mkdir()
    return {"dev-zero": (Path("/dev/zero"), "a character device"),
            "dev-urandom": (Path("/dev/urandom"), "a character device"),
            "fifo": (tmp_path / "efifo.toml", "a FIFO (named pipe)"),
            "folder": (tmp_path / "folder.toml", "a directory")}


# -- the one helper: read_limited --------------------------------------------------------------

@pytest.mark.parametrize("kind", ["dev-zero", "dev-urandom", "fifo", "folder"])
def test_read_limited_refuses_what_is_not_a_regular_file(special, kind):
    path, what = special[kind]
    with pytest.raises(ArkError) as err:
        read_limited(path, "target profile", 1 << 20)
    assert err.value.message == f"target profile {path} is {what}, not a regular file"


def test_read_limited_bounds_the_size_by_stat_and_by_reading(tmp_path):
    path = tmp_path / "big.toml"
    path.write_bytes(b"x" * 101)
    assert read_limited(path, "target profile", 101) == b"x" * 101
    with pytest.raises(ArkError, match="big.toml is 101 bytes; the limit is 100 bytes"):
        read_limited(path, "target profile", 100)
    # /proc files say size 0 in stat: the read itself stops after max_bytes + 1
    with pytest.raises(ArkError, match="is more than 10 bytes; the limit is 10 bytes"):
        read_limited(Path("/proc/self/status"), "status", 10)


def test_small_json_files_are_bounded(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"a": 1}' + " " * 200)
    with pytest.raises(ArkError, match="config.json is 208 bytes; the limit is 100 bytes"):
        read_json_object(config, max_bytes=100)
    config.unlink()
    config.symlink_to("/dev/zero")
    with pytest.raises(ArkError, match="is a character device, not a regular file"):
        read_json_object(config)


# -- target profiles, configs, calibration files -----------------------------------------------

@pytest.mark.parametrize("command", ["targets show {X}", "plan demo --target {X} -q q4_0",
                                     "build demo --target {X} -q q4_0 -o {OUT}"])
@pytest.mark.parametrize("kind", ["dev-zero", "dev-urandom", "fifo", "folder"])
def test_target_profiles_are_regular_files_only(special, tmp_path, command, kind):
    path, what = special[kind]
    args = command.replace("{X}", str(path)).replace("{OUT}", str(tmp_path / "out")).split()
    one_error(run_bounded(lambda: invoke(*args)),
              f"target profile {path} is {what}, not a regular file")
    assert not (tmp_path / "out").exists()


def test_an_oversize_target_profile_is_refused_with_the_size_and_the_limit(tmp_path):
    path = tmp_path / "huge.toml"
    path.write_bytes(b"# " + b"x" * (1 << 20))
    one_error(invoke("targets", "show", path),
              f"target profile {path} is 1,048,578 bytes; the limit is 1,048,576 bytes")


def test_a_config_json_that_is_a_device_is_refused(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    for f in demo_model_path().iterdir():
        if f.is_file() and f.name != "config.json":
            (folder / f.name).symlink_to(f)
    (folder / "config.json").symlink_to("/dev/zero")
    one_error(run_bounded(lambda: invoke("inspect", folder)),
              "config.json is a character device, not a regular file")


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_calib_paths_say_what_they_are(special, tmp_path, kind):
    """A folder is a corpus of one domain per file (`--calib DIR`): an empty one says so."""
    path, what = special[kind]
    out = tmp_path / "q"
    result = run_bounded(lambda: invoke("quantize", "demo", "--method", "gptq", "--calib", path,
                                        "--samples", "2", "--seq-len", "16", "-o", out))
    expected = (f"--calib {path} is a folder with no .txt" if kind == "folder" else
                f"calibration file {path} is {what}, not a regular file")
    text = one_error(result, expected)
    assert "does not exist" not in text


def test_an_oversize_calib_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from arkinfer.quant import calib_corpus, calib_data

    path = tmp_path / "calib.txt"
    path.write_text("words " * 100)
    monkeypatch.setattr(calib_corpus, "CALIB_MAX_BYTES", 100)
    with pytest.raises(ArkError, match="calib.txt is 600 bytes; the limit is 100 bytes") as err:
        calib_data.load_calibration(load_tokenizer(demo_model_path()), path, 2, 16)
    assert "--samples x --seq-len" in err.value.hint


# -- eval: tokenised piece by piece, only as far as --max-windows needs --------------------------

def _big_text(path: Path, megabytes: int) -> Path:
    block = CORPORA[0].read_text(encoding="utf-8")
    with path.open("w", encoding="utf-8") as fh:
        for _ in range(megabytes * (1 << 20) // len(block) + 1):
            fh.write(block)
    return path


def test_eval_max_windows_reads_only_the_start_of_a_50_mb_text(tmp_path):
    big = _big_text(tmp_path / "big50.txt", 50)

    def run() -> dict:
        from arkinfer import text_pieces

        read = [0]
        pieces = text_pieces.read_pieces

        def counted(*args, **kw):
            for piece in pieces(*args, **kw):
                read[0] += len(piece)
                yield piece

        text_pieces.read_pieces = counted  # the forked child's own copy
        return {**invoke("eval", "demo", "--text", big, "--ctx", "64", "--max-windows", "1",
                         "--json"), "read": read[0]}

    result = run_bounded(run)  # the old whole-file tokenisation needed ~9 GB
    assert result["exit_code"] == 0, result["output"]
    assert '"windows": 1' in result["output"] and '"tokens": 63' in result["output"]
    assert result["read"] <= 2 * (1 << 20), result["read"]


def test_eval_without_max_windows_streams_a_big_text_in_bounded_memory(tmp_path):
    from arkinfer.generate import stream_windows
    from arkinfer.text_pieces import read_pieces, tokenize_pieces

    big = _big_text(tmp_path / "big4.txt", 4)

    def run() -> dict:
        tok = load_tokenizer(demo_model_path())
        ids = tokenize_pieces(read_pieces(big, "--text file"),
                              lambda t: tok.encode(t, add_special_tokens=False))
        return {"windows": sum(1 for _ in stream_windows(ids, 512))}

    assert run_bounded(run)["windows"] > 1000


def test_eval_gives_the_documented_protocol_exactly(tmp_path, monkeypatch):
    """Whole-file tokenisation, windows_of, perplexity (docs/commands.md's protocol) and the CLI's
    streamed pieces give the same windows and the same numbers, pieces forced small."""
    import json

    from arkinfer import text_pieces
    from arkinfer.frontend.checkpoint import load
    from arkinfer.generate import model_logits_fn, perplexity

    monkeypatch.setattr(text_pieces, "CHUNK_CHARS", 300)
    tok = load_tokenizer(demo_model_path())
    text = CORPORA[0]
    ids = tok.encode(text.read_text(encoding="utf-8"), add_special_tokens=False)
    _, net = load(demo_model_path())
    short = tmp_path / "short.txt"
    short.write_text("A short text of a few words.\nAnd a second line.")
    short_ids = tok.encode(short.read_text(), add_special_tokens=False)
    for path, ctx, windows, expected_ids in ((text, 128, None, ids), (text, 64, 3, ids[:192]),
                                             (short, 64, None, short_ids)):
        expected = perplexity(model_logits_fn(net), expected_ids, ctx)
        args = ["eval", "demo", "--text", path, "--ctx", ctx, "--json"]
        got = invoke(*args, *(["--max-windows", windows] if windows else []))
        assert got["exit_code"] == 0, got["output"]
        got = json.loads(got["output"])
        assert (got["tokens"], got["windows"]) == (expected.tokens, expected.windows)
        assert got["ppl"] == pytest.approx(expected.ppl, rel=1e-9)


def test_text_read_in_pieces_is_the_text_read_whole(tmp_path):
    from arkinfer.text_pieces import read_pieces

    path = tmp_path / "t.txt"
    path.write_bytes("line one\r\nline two\rthree é\n\r\n".encode() * 50)
    for size in (1, 7, 4096):
        assert "".join(read_pieces(path, "--text file", size)) == path.read_text()
    path.write_bytes(b"x" * 10_000 + "é".encode() * 10 + b"\xff")
    with pytest.raises(ArkError, match="is not UTF-8 text: invalid start byte at byte 10020"):
        list(read_pieces(path, "--text file", 100))


# -- tokenising in pieces gives the whole-text ids -------------------------------------------------

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
           r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _trained(kind: str):
    """A small tokenizer of `kind` trained on corpus_train.txt (well under a second each)."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    byte_level = pre_tokenizers.ByteLevel.alphabet()
    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=600, special_tokens=["<unk>"],
                                          unk_token="<unk>")
    elif kind in ("byte-level", "llama3-split"):
        tok = Tokenizer(models.BPE())
        trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=byte_level)
    else:
        tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>"])
    if kind == "byte-level":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif kind == "llama3-split":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif kind.startswith("metaspace-") or kind == "unigram":
        scheme = kind.removeprefix("metaspace-") if kind != "unigram" else "first"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme)
    elif kind == "sentencepiece-normalizer":  # Llama 2's tokenizer.json: "▁" prepended to all
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
    tok.train_from_iterator(CORPORA[1].read_text(encoding="utf-8").split("\n\n"), trainer)
    return lambda text: tok.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    demo = load_tokenizer(demo_model_path())
    kinds = ["byte-level", "llama3-split", "metaspace-first", "metaspace-always",
             "sentencepiece-normalizer", "unigram"]
    return {"demo": lambda text: demo.encode(text, add_special_tokens=False),
            **{kind: _trained(kind) for kind in kinds}}


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda p: p.name)
@pytest.mark.parametrize("kind", ["demo", "byte-level", "llama3-split", "metaspace-first",
                                  "metaspace-always", "sentencepiece-normalizer", "unigram"])
def test_pieces_give_the_whole_text_ids(tokenizers, kind, corpus):
    from arkinfer.text_pieces import tokenize_pieces

    tokenize = tokenizers[kind]
    text = corpus.read_text(encoding="utf-8")
    one_line = text.replace("\n", " ")  # no line starts: cuts fall before spaces
    for sample in (text, one_line):
        whole = tokenize(sample)
        for chunk, split in ((64, None), (500, 37), (4096, 1000)):
            texts = [sample] if split is None else [sample[i:i + split]
                                                    for i in range(0, len(sample), split)]
            pieces = list(tokenize_pieces(texts, tokenize, chunk))
            assert [i for p in pieces for i in p] == whole, (kind, chunk, split)
            assert len(pieces) > len(sample) // (2 * chunk) or chunk > len(sample)


# -- bench: numbers range-checked before anything is loaded ------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["-p", "99999999999999999999"], "-p 99999999999999999999 is outside the allowed range "
     "0..16,777,216"),
    (["-p", "512,99999999999999999999"], "-p 99999999999999999999 is outside"),
    (["-n", "99999999999999999999"], "-n 99999999999999999999 is outside"),
    (["-d", "99999999999999999999"], "-d 99999999999999999999 is outside"),
    (["-p", "50000000"], "-p 50000000 is outside the allowed range"),
    (["-r", "99999999999"], "-r 99999999999 is outside the allowed range 1..10,000"),
    (["--warmup", "99999999999"], "--warmup 99999999999 is outside the allowed range 0..1,000"),
    (["--threads", "100000"], f"--threads 100000 is outside the allowed range 1..{os.cpu_count()}"),
    (["-p", "0", "-n", "0"], "at least one test"),
    (["--rpc-timeout", "0"], "--rpc-timeout 0.0 is not a number of seconds"),
])
def test_bench_numbers_are_checked_before_the_artifact_is_opened(tmp_path, args, needle):
    start = time.monotonic()
    out = one_error(invoke("bench", tmp_path / "not-read", *args), needle)
    assert time.monotonic() - start < 5
    assert "hint: pass" in out or "hint: e.g." in out


class _Runner:
    """A runner that must not be asked for tokens (the context check comes first)."""

    n_ctx = 64

    def tokenize(self, text: str) -> list[int]:
        raise AssertionError("tokens made before the context check")


def test_bench_checks_the_context_before_making_tokens():
    from arkinfer.backend import runner_context
    from arkinfer.pipeline.bench import BenchSpec, run_bench

    runner = _Runner()
    context = runner_context(runner, {"max_position_embeddings": 4096})
    assert context == 64
    with pytest.raises(ArkError) as err:
        run_bench(runner, {"name": "art"}, BenchSpec(prompts=(100,), gens=(8,)), context=context)
    assert "-p 100" in err.value.message and "art holds 64 tokens" in err.value.message
    assert "pass -p, -n and -d values" in err.value.hint and "Python" not in err.value.hint


# -- bench --plot: exactly the path named, or refused ------------------------------------------

@pytest.mark.parametrize("name,needle", [
    ("/dev/full", "the file name must end in .png, .svg, .pdf"),
    (".", "the file name must end in"),
    ("efifo", "the file name must end in"),
    ("x.txt", "the file name must end in"),
    (".png", "the file name must end in"),
    ("fifo.png", "is a FIFO (named pipe), not a file a plot can replace"),
    ("dir.png", "is a folder, not a file a plot can replace"),
])
def test_bench_plot_paths_are_checked_up_front(tmp_path, monkeypatch, name, needle):
    monkeypatch.chdir(tmp_path)
    os.mkfifo("efifo")
    os.mkfifo("fifo.png")
    os.mkdir("dir.png")
    before = sorted(os.listdir("."))
    one_error(invoke("bench", tmp_path / "not-read", "--plot", name), needle)
    assert sorted(os.listdir(".")) == before and not Path("/dev/full.png").exists()


def test_a_plot_is_written_exactly_where_named_and_atomically(tmp_path):
    from arkinfer.pipeline.bench import write_plot

    rows = [{"test": t, "attention": "default", "n_depth": d, "avg_ts": 10.0 + d,
             "stddev_ts": 1.0} for t in ("pp8", "tg4") for d in (0, 8)]
    path = tmp_path / "plots" / "bench.png"
    assert write_plot(rows, path, "demo") == path
    assert path.read_bytes().startswith(b"\x89PNG")
    link = tmp_path / "link.svg"
    target = tmp_path / "kept.txt"
    target.write_text("user data")
    link.symlink_to(target)
    assert write_plot(rows, link, "demo") == link  # the link is replaced, never written through
    assert target.read_text() == "user data" and not link.is_symlink()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["bench.png", "kept.txt", "link.svg",
                                                          "plots"]
