"""Train an EAGLE-3 draft head for a target model (by default the embedded demo) and write it.

    python examples/eagle3/train_eagle3_head.py                  # demo -> arkinfer/demo/eagle3/
    python examples/eagle3/train_eagle3_head.py --target ./model --out ./model-eagle3 \\
        --tap-layers 1 14 27 --draft-vocab 32000

Deterministic: fixed seed, CPU. The head must predict what the TARGET would say, so:

1. Data: the training text (`arkinfer/data/corpus_train.txt` paragraphs; its Q&A paragraphs also
   rendered through the target's chat template) plus what the target itself writes, which is
   what speculative decoding drafts against: from prompts taken from the text (each paragraph's
   opening, each question and chat prompt, `--spans` random spans after BOS) the target's greedy
   continuation and `--samples` nucleus-sampled ones (`--generate` tokens each, `--temperature`,
   `--top-p`). All of it is cut into windows of seq_len + ttt tokens.
2. One pass of the target over every window records, per position, the three taps (the residual
   stream entering the tap layers) and the target's logits.
3. The head learns, at each position p, from (fused taps at p, embedding of token p + 1) the
   target's distribution at p + 1: cross-entropy against the target's softmax restricted to the
   draft vocabulary (at `--target-temp`) plus `--hard` x cross-entropy against the target's
   argmax, the token greedy verification accepts. EAGLE-3's training-time test unrolls `--ttt`
   steps: step k feeds the head's own output hidden state of step k - 1 and token p + 1 + k at
   position p + k, attending to step 0's keys at positions <= p and to its own earlier steps'
   keys of row p only: the cache a chain draft holds after k drafted tokens. Step k's loss is weighted 0.8^k.

embed_tokens is a frozen copy of the target's; norm and lm_head start from the target's final
norm and lm_head (rows of the draft vocabulary). `--draft-vocab K` keeps the K most frequent
training tokens (plus the stop ids): FR-Spec. Prints the top-1 agreement with the target at each
unroll step on the held-out text (`corpus_eval.txt`) and on the target's greedy continuations of
prompts taken from it ("held-out greedy": what speculative decoding sees). About 7.5 minutes on one
CPU core for the demo.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from pathlib import Path

import torch

from arkinfer.frontend.checkpoint import load
from arkinfer.speculative.eagle3_head import Eagle3Config, Eagle3Head, save_eagle3
from arkinfer.speculative.frspec import frequent_vocabulary, token_frequencies
from arkinfer.speculative.taps import check_tap_layers

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "arkinfer" / "data" / "corpus_train.txt"
HELD_OUT = ROOT / "arkinfer" / "data" / "corpus_eval.txt"
DEMO = ROOT / "arkinfer" / "demo"
QA = re.compile(r"^Question:\s*(?P<q>.+?)\s*\nAnswer:\s*(?P<a>.+)$", re.DOTALL)
PROMPT_TOKENS = 12  # continuation prompts: at most 12 tokens (one length: one batch)
SPAN_LENGTHS = (0, 4, 8, 16, 32, 48)  # tokens after BOS in the random-span prompts
STEP_WEIGHT = 0.8  # SpecForge's weight of unroll step k: 0.8^k


def documents(tok, text: str) -> tuple[list[list[int]], list[list[int]]]:
    """(documents, prompts) as token ids: each paragraph (BOS first) and, for Q&A paragraphs,
    the exchange rendered as a chat. Prompts, for the target to continue: each paragraph's first
    PROMPT_TOKENS tokens, and the last PROMPT_TOKENS of each question and chat prompt."""
    docs, prompts = [], []
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        ids = tok.encode(para)
        docs.append(ids)
        prompts.append(ids[:PROMPT_TOKENS])  # the opening; the others keep their ends
        m = QA.match(para)
        if m:
            prompts.append(tok.encode(f"Question: {m['q']}\nAnswer:"))
            if tok.chat_template:
                user = [{"role": "user", "content": m["q"]}]
                docs.append(tok.encode_chat(user + [{"role": "assistant", "content": m["a"]}],
                                            add_generation_prompt=False))
                prompts.append(tok.encode_chat(user))
    return docs, [p[-PROMPT_TOKENS:] for p in prompts]


def spans(docs: list[list[int]], count: int, gen: torch.Generator) -> list[list[int]]:
    """`count` prompts: BOS (the first token of every document) + a random span of a random
    document, its length drawn from SPAN_LENGTHS (few lengths: few batches)."""
    out = []
    for _ in range(count):
        doc = docs[int(torch.randint(len(docs), (1,), generator=gen))]
        n = SPAN_LENGTHS[int(torch.randint(len(SPAN_LENGTHS), (1,), generator=gen))]
        start = int(torch.randint(1, max(2, len(doc) - n), (1,), generator=gen))
        out.append(doc[:1] + doc[start: start + n])
    return out


def pick(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator
         ) -> torch.Tensor:
    """logits [B, V] -> next ids [B, 1]: the argmax at temperature 0, else a nucleus sample."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    probs, ids = torch.softmax(logits.float() / temperature, dim=-1).sort(-1, descending=True)
    probs = probs * (probs.cumsum(-1) - probs < top_p)  # the smallest head of mass >= top_p
    return ids.gather(-1, torch.multinomial(probs, 1, generator=gen))


@torch.no_grad()
def continuations(model, prompts: list[list[int]], new: int, temperature: float = 0.0,
                  top_p: float = 1.0, gen: torch.Generator | None = None, batch: int = 128
                  ) -> list[list[int]]:
    """Each prompt followed by `new` tokens of the target (greedy at temperature 0, else
    sampled), prompts batched by length. Stop ids do not end a row: a decode runs past them."""
    by_length: dict[int, list[list[int]]] = {}
    for p in prompts:
        by_length.setdefault(len(p), []).append(p)
    out = []
    for length, group in sorted(by_length.items()):
        for rows in (group[i: i + batch] for i in range(0, len(group), batch)):
            ids = torch.tensor(rows)
            cache = model.empty_cache(len(rows))
            logits, cache = model(ids, torch.arange(length), cache)
            for i in range(new):
                nxt = pick(logits[:, -1], temperature, top_p, gen)
                ids = torch.cat([ids, nxt], dim=1)
                logits, cache = model(nxt, torch.tensor([length + i]), cache)
            out += ids.tolist()
    return out


def windows(docs: list[list[int]], size: int) -> torch.Tensor:
    """The documents concatenated, cut into non-overlapping windows: int64 [N, size]."""
    stream = torch.tensor([t for d in docs for t in d])
    n = len(stream) // size
    return stream[: n * size].view(n, size)


@torch.no_grad()
def target_pass(model, tokens: torch.Tensor, tap_layers: tuple[int, ...], batch: int = 16
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [N, L] -> (taps float32 [N, L, 3H] = cat of the inputs of the tap layers,
    target logits bfloat16 [N, L, V]); each window from position 0."""
    recorded: dict[int, torch.Tensor] = {}
    hooks = [model.model.layers[i].register_forward_pre_hook(
        lambda _mod, args, i=i: recorded.__setitem__(i, args[0])) for i in tap_layers]
    taps, logits = [], []
    try:
        for chunk in tokens.split(batch):
            out, _ = model(chunk, torch.arange(chunk.shape[1]), model.empty_cache(len(chunk)))
            taps.append(torch.cat([recorded[i].float() for i in tap_layers], dim=-1))
            logits.append(out.to(torch.bfloat16))
    finally:
        for h in hooks:
            h.remove()
    return torch.cat(taps), torch.cat(logits)


def unrolled_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]
                       ) -> torch.Tensor:
    """q [B, nh, S, hd] of unroll step k = len(keys) - 1; keys/values [B, nkv, S, hd] of steps
    0..k. Row p sees step 0's keys 0..p and, of steps 1..k, only row p's. -> [B, nh, S, hd]."""
    group = q.shape[1] // keys[0].shape[1]
    ks = [k.repeat_interleave(group, dim=1) for k in keys]
    vs = [v.repeat_interleave(group, dim=1) for v in values]
    s = q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    first = (q @ ks[0].transpose(-1, -2)) * scale  # [B, nh, S, S]
    first = first.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    diag = [((q * k).sum(-1) * scale)[..., None] for k in ks[1:]]  # each [B, nh, S, 1]
    weights = torch.softmax(torch.cat([first, *diag], dim=-1), dim=-1)
    out = weights[..., :s] @ vs[0]
    for i, v in enumerate(vs[1:]):
        out = out + weights[..., s + i: s + i + 1] * v
    return out


def unroll(head: Eagle3Head, taps: torch.Tensor, tokens: torch.Tensor, seq: int, ttt: int
           ) -> list[torch.Tensor]:
    """Draft logits [B, seq, Vd] of each unroll step: step k at row p predicts the target's
    distribution at window position p + 1 + k. taps [B, L, 3H], tokens [B, L], L >= seq + ttt."""
    layer = head.midlayer
    hidden = head.fuse(taps[:, :seq])
    keys, values, out = [], [], []
    for k in range(ttt):
        q, key, value = layer.project(head.embed(tokens[:, 1 + k: 1 + k + seq]), hidden,
                                      torch.arange(seq) + k)
        keys.append(key)
        values.append(value)
        hidden = layer.complete(unrolled_attention(q, keys, values), hidden)
        out.append(head.logits(hidden))
    return out


def distill_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor, draft_ids: torch.Tensor,
                 temperature: float, hard: float) -> torch.Tensor:
    """Cross-entropy of the draft [.., Vd] against softmax(target [.., V] on the draft ids /
    temperature), plus `hard` x the cross-entropy against the target's argmax (a draft id; a
    target argmax outside the draft vocabulary adds nothing). Both push toward what greedy
    verification accepts: the demo's distribution is flat (perplexity ~1200), so the plain
    softmax alone teaches its argmax weakly."""
    target = target_logits[..., draft_ids].float()
    logp = torch.log_softmax(draft_logits, dim=-1)
    loss = -(torch.softmax(target / temperature, dim=-1) * logp).sum(-1).mean()
    if hard > 0:
        best = target.argmax(-1, keepdim=True)
        inside = (target_logits.float().amax(-1, keepdim=True) == target.gather(-1, best)).float()
        loss = loss - hard * (logp.gather(-1, best) * inside).mean()
    return loss


@torch.no_grad()
def agreement(head: Eagle3Head, taps, tokens, logits, seq: int, ttt: int) -> list[float]:
    """Per unroll step: the fraction of rows where the head's argmax (as a target id) is the
    target's argmax over its full vocabulary."""
    hits = [0] * ttt
    for t, x, y in zip(taps.split(16), tokens.split(16), logits.split(16)):
        for k, draft in enumerate(unroll(head, t, x, seq, ttt)):
            want = y[:, 1 + k: 1 + k + seq].float().argmax(-1)
            hits[k] += int((head.to_target(draft.argmax(-1)) == want).sum())
    return [h / (len(tokens) * seq) for h in hits]


def new_head(model, tap_layers: tuple[int, int, int], draft_ids: torch.Tensor) -> Eagle3Head:
    """A head shaped after the target (heads, head_dim, MLP width), its embeddings, final norm
    and lm_head rows copied; fc / attention / MLP at PyTorch's default initialisation."""
    tc = model.config
    cfg = Eagle3Config(
        hidden_size=tc.hidden_size, num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads, head_dim=tc.head_dim,
        intermediate_size=tc.intermediate_size, rms_norm_eps=tc.rms_norm_eps,
        rope_theta=tc.rope_theta, vocab_size=tc.vocab_size, draft_vocab_size=len(draft_ids),
        tap_layers=tap_layers, embed_scale=float(tc.embedding_scale),
        max_position_embeddings=tc.max_position_embeddings)
    head = Eagle3Head(cfg)
    with torch.no_grad():
        head.embed_tokens.weight.copy_(model.model.embed_tokens.weight.float())
        head.norm.weight.copy_(model.model.norm.weight.float())
        # MiniCPM divides the normed hidden state by its logit divisor before lm_head
        head.lm_head.weight.copy_(model.lm_head.weight.float()[draft_ids] / tc.logit_divisor)
        head.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
        head.t2d.zero_()
        head.t2d[draft_ids] = True
    return head


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=DEMO, help="the target model's folder")
    ap.add_argument("--out", type=Path, default=DEMO / "eagle3")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seq-len", type=int, default=256,
                    help="positions per window: a head trained on short windows fails on long prompts")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--ttt", type=int, default=3, help="unroll steps (SpecForge ttt_length)")
    ap.add_argument("--tap-layers", type=int, nargs=3, default=None,
                    help="target layers whose inputs the head reads (default 1, L//2, L-1)")
    ap.add_argument("--draft-vocab", type=int, default=None, metavar="K",
                    help="keep the K most frequent training tokens (default: the full vocabulary)")
    ap.add_argument("--generate", type=int, default=96,
                    help="tokens of the target per continuation added to the training data; 0: none")
    ap.add_argument("--spans", type=int, default=800,
                    help="random-span prompts (BOS + 0..48 tokens of a training document)")
    ap.add_argument("--samples", type=int, default=2,
                    help="sampled continuations per prompt, besides the greedy one")
    ap.add_argument("--temperature", type=float, default=0.8, help="of the sampled continuations")
    ap.add_argument("--top-p", type=float, default=0.95, help="of the sampled continuations")
    ap.add_argument("--target-temp", type=float, default=1.0,
                    help="temperature of the target distribution the head learns")
    ap.add_argument("--hard", type=float, default=1.0,
                    help="weight of the cross-entropy against the target's argmax")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads (1 is fastest for this small model on a busy machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.time()

    ckpt, model = load(args.target, dense=True)
    tok, layers = ckpt.tokenizer, ckpt.config.num_hidden_layers
    taps_at = check_tap_layers(args.tap_layers or (1, layers // 2, layers - 1), layers,
                               str(args.target))
    gen = torch.Generator().manual_seed(args.seed)
    docs, prompts = documents(tok, CORPUS.read_text(encoding="utf-8"))
    held_docs, held_prompts = documents(tok, HELD_OUT.read_text(encoding="utf-8"))
    held_own = []
    if args.generate > 0:
        # what speculative decoding sees: the target's own text, greedy and sampled
        prompts += spans(docs, args.spans, gen)
        own = continuations(model, prompts, args.generate)
        for _ in range(args.samples):
            own += continuations(model, prompts, args.generate, args.temperature, args.top_p, gen)
        docs += own
        held_own = continuations(model, held_prompts, args.generate)
    vocab = ckpt.config.vocab_size
    if args.draft_vocab is None:
        draft_ids = torch.arange(vocab)
    else:
        stops = ckpt.config.eos_token_id
        stops = stops if isinstance(stops, list) else [stops] if stops is not None else []
        draft_ids = frequent_vocabulary(token_frequencies(docs, vocab), args.draft_vocab, stops)
    head = new_head(model, taps_at, draft_ids)

    size = args.seq_len + args.ttt
    train_tokens = windows(docs, size)
    train_taps, train_logits = target_pass(model, train_tokens, taps_at)
    held = {"held-out": windows(held_docs, size)}
    if held_own:
        held["held-out greedy"] = windows(held_own, size)
    held = {name: (tokens, *target_pass(model, tokens, taps_at)) for name, tokens in held.items()}
    print(f"target {args.target}: taps at layers {list(taps_at)}, draft vocabulary "
          f"{len(draft_ids)}/{vocab}; {train_tokens.numel()} training tokens "
          f"({len(train_tokens)} windows), held-out: "
          + ", ".join(f"{n} {t.numel()}" for n, (t, _, _) in held.items())
          + f"; {time.time() - start:.0f}s", flush=True)

    def report(ttt: int) -> str:
        return "; ".join(f"{name} " + " ".join(f"{a:.3f}" for a in agreement(
            head, taps, tokens, logits, args.seq_len, ttt)) for name, (tokens, taps, logits)
            in held.items())

    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    for step in range(args.steps):
        lr_now = args.lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr_now
        rows = torch.randint(0, len(train_tokens), (args.batch,), generator=gen)
        drafts = unroll(head, train_taps[rows], train_tokens[rows], args.seq_len, args.ttt)
        loss = sum(STEP_WEIGHT ** k * distill_loss(
            d, train_logits[rows, 1 + k: 1 + k + args.seq_len], draft_ids, args.target_temp,
            args.hard) for k, d in enumerate(drafts))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 250 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}  top-1: {report(1)}  "
                  f"lr {lr_now:.2e}  {time.time() - start:.0f}s", flush=True)

    head.eval()
    print(f"held-out agreement with the target's argmax at steps 1..{min(4, args.ttt)}: "
          + report(min(4, args.ttt)))
    save_eagle3(head, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
