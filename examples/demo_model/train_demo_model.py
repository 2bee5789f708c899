"""Train ArkInfer's embedded demo model (a tiny MiniCPM4.1-architecture LM) and write it.

    python examples/demo_model/train_demo_model.py            # writes arkinfer/demo/
    python examples/demo_model/train_demo_model.py --out /tmp/demo --steps 50

Deterministic: fixed seed, single process. Trains the project's own reference model class
(`arkinfer.models.minicpm`) on `arkinfer/data/corpus_train.txt`, tokenized with
`arkinfer/demo/tokenizer.json` (made by train_tokenizer.py). Q&A paragraphs of the corpus
("Question: ... Answer: ...") are also shown as ChatML turns so the model learns the chat format.
Weights are saved in bf16 (like the released MiniCPM4.1) as two safetensors shards with an index,
exactly the Hugging Face layout. Takes about 10 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch

from arkinfer.models.minicpm import MiniCPMConfig, MiniCPMForCausalLM

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "arkinfer" / "data" / "corpus_train.txt"
HELD_OUT = ROOT / "arkinfer" / "data" / "corpus_eval.txt"
DEMO = ROOT / "arkinfer" / "demo"

# hidden 128, 2 KV heads x 32 = 64 outputs for k/v, ffn 384: every in_features % 128 == 0 and every
# out_features % 64 == 0, so Marlin / GPTQ / AWQ / GGUF blocks all accept every linear.
HALF_DIM = 16
FACTORS = [round(1.0 * 4.0 ** (i / (HALF_DIM - 1)), 6) for i in range(HALF_DIM)]
CONFIG = {
    "architectures": ["MiniCPMForCausalLM"],
    "model_type": "minicpm",
    "vocab_size": 2048,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 384,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "scale_emb": 12,
    "scale_depth": 1.4,
    "dim_model_base": 32,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": [2],  # + the id of <|im_end|>, filled in from the tokenizer by save()
    "pad_token_id": 2,
    "rope_scaling": {"rope_type": "longrope", "long_factor": FACTORS, "short_factor": FACTORS,
                     "original_max_position_embeddings": 4096},
    # InfLLM v2 scaled down so sparse attention engages at demo-sized contexts: 64-token blocks,
    # a 256-token local window (4 blocks) + 4 selected blocks, sparse from 1024 tokens on.
    "sparse_config": {"kernel_size": 32, "kernel_stride": 16, "block_size": 64, "init_blocks": 1,
                      "window_size": 256, "topk": 4, "use_nope": False, "dense_len": 1024},
}

# Each Q&A pair is shown this many times as a ChatML exchange: a 1.3 M-parameter model needs the
# repetition to map a question to the start of its answer (the prose alone teaches continuation).
CHAT_REPEATS = 8
QA = re.compile(r"^Question:\s*(?P<q>.+?)\s*\nAnswer:\s*(?P<a>.+)$", re.S)


def documents(text: str) -> list[str]:
    """Paragraphs; Q&A paragraphs also appear CHAT_REPEATS times as ChatML exchanges."""
    docs = []
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        docs.append(para)
        m = QA.match(para)
        if m:
            docs += [f"<|im_start|>user\n{m['q']}<|im_end|>\n<|im_start|>assistant\n"
                     f"{m['a']}<|im_end|>\n"] * CHAT_REPEATS
    return docs


def token_stream(tokenizer, docs: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for doc in docs:
        ids.extend(tokenizer.encode(doc, add_special_tokens=True).ids)  # BOS before each document
    return torch.tensor(ids, dtype=torch.long)


def train(steps: int, seq: int, batch: int, lr: float, seed: int) -> MiniCPMForCausalLM:
    from tokenizers import Tokenizer

    torch.manual_seed(seed)
    tokenizer = Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    data = token_stream(tokenizer, documents(CORPUS.read_text(encoding="utf-8")))
    held_out = token_stream(tokenizer, documents(HELD_OUT.read_text(encoding="utf-8")))
    print(f"{len(data)} training tokens, {len(held_out)} held-out tokens")
    model = MiniCPMForCausalLM(MiniCPMConfig.from_hf(CONFIG))
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            torch.nn.init.ones_(p)
        else:
            torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    positions = torch.arange(seq)
    start = time.time()
    for step in range(steps):
        lr_now = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr_now
        offsets = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
        x = torch.stack([data[o:o + seq] for o in offsets])
        y = torch.stack([data[o + 1:o + seq + 1] for o in offsets])
        logits, _ = model(x, positions, model.empty_cache(batch))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}  held-out {held_out_loss(model, held_out, seq):.3f}"
                  f"  lr {lr_now:.2e}  {time.time() - start:.0f}s", flush=True)
    return model


@torch.no_grad()
def held_out_loss(model: MiniCPMForCausalLM, data: torch.Tensor, seq: int) -> float:
    """Mean next-token loss on the held-out text (consecutive windows of `seq`)."""
    n = (len(data) - 1) // seq
    x = data[: n * seq].view(n, seq)
    y = data[1: n * seq + 1].view(n, seq)
    logits, _ = model(x, torch.arange(seq), model.empty_cache(n))
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


def save(model: MiniCPMForCausalLM, out: Path) -> None:
    """Two bf16 shards + index + config.json into `out` (tokenizer files are copied alongside)."""
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    names = list(state)
    split = names.index("model.layers.2.input_layernorm.weight")
    shards = [names[:split], names[split:]]
    tmp = Path(tempfile.mkdtemp(dir=out.parent))
    weight_map, total = {}, 0
    for i, part in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: state[n] for n in part}, str(tmp / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
        total += sum(state[n].numel() * 2 for n in part)
    (tmp / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    from tokenizers import Tokenizer

    im_end = Tokenizer.from_file(str(DEMO / "tokenizer.json")).token_to_id("<|im_end|>")
    config = dict(CONFIG, eos_token_id=[2, im_end])
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    for f in tmp.iterdir():
        shutil.move(str(f), out / f.name)
    tmp.rmdir()
    if out.resolve() != DEMO.resolve():
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                     "chat_template.jinja"):
            if (DEMO / name).exists():
                shutil.copy(DEMO / name, out / name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEMO)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    model = train(args.steps, args.seq, args.batch, args.lr, args.seed)
    save(model.eval(), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
