"""Write tiny GGUF files the way llama.cpp's converter does, for tests of the GGUF import.

`write_tiny_gguf` draws random Hugging Face weights, renames them to GGUF names, permutes q/k rows
like `convert_hf_to_gguf.py` (llama, minicpm), optionally quantises the 2-D weights, and writes a
small tokenizer: a byte-level BPE (`gpt2`) or a SentencePiece (`llama`) vocabulary trained on a
few sentences, so both tokenizer paths of the importer can be exercised (and compared with
llama.cpp).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from arkinfer.frontend.gguf_model import GLOBAL_NAMES, LAYER_NAMES, permute_qk

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello world, hello there! "
    "def main():\n    return 42\n# comment\nprint('hi')  # ok\n"
    "Numbers 1234567 and 3.14; the theory of the thing, then the other one."
)
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _train_merges(words: list[list[str]], count: int) -> list[tuple[str, str]]:
    """Plain BPE training: merge the most frequent adjacent pair `count` times."""
    merges = []
    words = [list(w) for w in words]
    for _ in range(count):
        pairs = Counter((a, b) for w in words for a, b in itertools.pairwise(w))
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return merges


def bpe_vocab(n_merges: int = 60) -> dict[str, Any]:
    """A tiny byte-level BPE vocabulary: 3 control tokens, 256 bytes, merges, 1 user token."""
    table = bytes_to_unicode()
    words = [[table[b] for b in w.encode()] for w in re.findall(r" ?\w+| ?[^\w\s]+|\s+", CORPUS)]
    merges = _train_merges(words, n_merges)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [table[b] for b in range(256)]
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
    tokens.append("<tool_call>")
    types = [3, 3, 3] + [1] * (len(tokens) - 4) + [4]
    return {"model": "gpt2", "tokens": tokens, "types": types,
            "merges": [f"{a} {b}" for a, b in merges], "bos": 1, "eos": 2, "unk": 0, "pad": 2}


def spm_vocab(n_merges: int = 80) -> dict[str, Any]:
    """A tiny SentencePiece-style vocabulary: <unk> <s> </s>, 256 byte tokens, pieces + scores."""
    text = "▁" + CORPUS.replace(" ", "▁").replace("\n", "▁")
    words = [["▁"] + list(w) for w in text.split("▁") if w]
    chars = sorted({c for w in words for c in w})
    merges = _train_merges(words, n_merges)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for rank, (a, b) in enumerate(merges):
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(1)
            scores.append(-float(rank))
    for i, c in enumerate(chars):
        tokens.append(c)
        types.append(1)
        scores.append(-1000.0 - i)
    return {"model": "llama", "tokens": tokens, "types": types, "scores": scores,
            "bos": 1, "eos": 2, "unk": 0, "pad": None}


def _add_vocab(w, vocab: dict[str, Any], pre: str | None, add_bos: bool | None) -> None:
    w.add_tokenizer_model(vocab["model"])
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    if "scores" in vocab:
        w.add_token_scores(vocab["scores"])
    if "merges" in vocab:
        w.add_token_merges(vocab["merges"])
    for key, fn in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                    ("unk", w.add_unk_token_id), ("pad", w.add_pad_token_id)):
        if vocab.get(key) is not None:
            fn(vocab[key])
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template(CHATML)


def write_tiny_gguf(path: str | Path, arch: str = "llama", *, tokenizer: str = "gpt2",
                    pre: str | None = "smollm", add_bos: bool | None = None, tied: bool = False,
                    quant: str | None = None, layers: int = 2, hidden: int = 64, heads: int = 4,
                    kv_heads: int = 2, ffn: int = 128, seed: int = 0,
                    vocab: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Write a tiny `arch` GGUF to `path`; returns the original HF-named float32 tensors.

    quant: ggml type name (e.g. "Q8_0", "Q4_1") for the 2-D weights, else F32. MiniCPM files get
    embedding/residual/logit scales (12, 1.4/sqrt(L), hidden/32) and LongRoPE factor tensors.
    """
    import gguf

    vocab = vocab or (bpe_vocab() if tokenizer == "gpt2" else spm_vocab())
    n_vocab, head_dim = len(vocab["tokens"]), hidden // heads
    rng = np.random.default_rng(seed)
    shapes = {"attn_norm.weight": (hidden,), "attn_q.weight": (heads * head_dim, hidden),
              "attn_k.weight": (kv_heads * head_dim, hidden),
              "attn_v.weight": (kv_heads * head_dim, hidden),
              "attn_output.weight": (hidden, heads * head_dim), "ffn_norm.weight": (hidden,),
              "ffn_gate.weight": (ffn, hidden), "ffn_up.weight": (ffn, hidden),
              "ffn_down.weight": (hidden, ffn)}
    if arch == "qwen2":
        shapes.update({"attn_q.bias": (heads * head_dim,), "attn_k.bias": (kv_heads * head_dim,),
                       "attn_v.bias": (kv_heads * head_dim,)})
    if arch == "qwen3":
        shapes.update({"attn_q_norm.weight": (head_dim,), "attn_k_norm.weight": (head_dim,)})
    gguf_shapes = {"token_embd.weight": (n_vocab, hidden)}
    for i in range(layers):
        gguf_shapes.update({f"blk.{i}.{k}": v for k, v in shapes.items()})
    gguf_shapes["output_norm.weight"] = (hidden,)
    if not tied:
        gguf_shapes["output.weight"] = (n_vocab, hidden)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    if arch == "minicpm":
        w.add_embedding_scale(12.0)
        w.add_residual_scale(1.4 / math.sqrt(layers))
        w.add_logit_scale(hidden / 32)
    _add_vocab(w, vocab, pre if tokenizer == "gpt2" else None, add_bos)

    originals: dict[str, np.ndarray] = {}
    qtype = gguf.GGMLQuantizationType[quant] if quant else None
    for name, shape in gguf_shapes.items():
        norm = name.endswith("norm.weight")
        data = (1.0 + 0.1 * rng.standard_normal(shape) if norm
                else 0.05 * rng.standard_normal(shape)).astype(np.float32)
        if name.startswith("blk."):
            _, layer, suffix = name.split(".", 2)
            hf = f"model.layers.{layer}.{LAYER_NAMES[suffix]}"
        else:
            hf = GLOBAL_NAMES[name]
        originals[hf] = data
        stored = data
        if arch in ("llama", "minicpm") and ".attn_q." in name:
            stored = permute_qk(data, heads)
        elif arch in ("llama", "minicpm") and ".attn_k." in name:
            stored = permute_qk(data, kv_heads)
        if qtype is not None and stored.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(stored, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, np.ascontiguousarray(stored))
    if arch == "minicpm":
        half = head_dim // 2
        w.add_tensor("rope_factors_long.weight", np.linspace(1.0, 8.0, half, dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.linspace(1.0, 2.0, half, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return originals
