"""Train the byte-level BPE tokenizer of ArkInfer's demo model and write its files.

    python examples/demo_model/train_tokenizer.py               # writes arkinfer/demo/
    python examples/demo_model/train_tokenizer.py --out /tmp/tok

Writes tokenizer.json, tokenizer_config.json, generation_config.json and chat_template.jinja.
Deterministic: the same corpus gives byte-identical files (BPE training in `tokenizers` breaks
count ties by pair id and its alphabet is sorted; everything written here is in a fixed order;
tests/test_demo_tokenizer.py checks it). Runs in about a second.

Vocabulary: exactly 2048 ids (a multiple of 64, as int4 kernels want), laid out as

    0 <unk>   1 <s> (BOS)   2 </s>   3 <|im_start|>   4 <|im_end|>      special
    5 .. 260  the 256 byte-level symbols
    261 .. 2045  BPE merges learned on arkinfer/data/corpus_train.txt
    2046 <think>   2047 </think>                                        added, special=False

`<think>`/`</think>` are added tokens that are NOT special, as in MiniCPM4.1 and Qwen3: they are
matched as single tokens, but `decode(..., skip_special_tokens=True)` keeps them, so a reasoning
trace stays visible and can be split off by the caller. `<unk>` exists for MiniCPM parity but is
never produced: byte-level BPE covers every byte, so any unicode string round-trips.

End tokens: the chat EOS is `<|im_end|>` (tokenizer_config `eos_token`), and `</s>` (id 2) is also
an end token: generation_config.json has `eos_token_id: [2, 4]`, like MiniCPM4.1's [2, 73440].
Padding uses `</s>` (id 2), matching the model config's `pad_token_id`.

BOS: the post-processor puts `<s>` before every sequence (`encode(text).ids[0] == 1`), as MiniCPM's
tokenizer does; `add_special_tokens=False` leaves it out. The chat template also starts with
`bos_token` when the renderer passes one (arkinfer and transformers do), so a rendered chat encoded
with `add_special_tokens=False` (how both encode chats) starts with exactly one BOS, the way the
demo model saw chats in training.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "arkinfer" / "data" / "corpus_train.txt"
DEMO = ROOT / "arkinfer" / "demo"

VOCAB_SIZE = 2048
MODEL_MAX_LENGTH = 4096  # the demo model's max_position_embeddings
SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]  # ids 0..4
THINK = ["<think>", "</think>"]  # the last two ids, added tokens with special=False
BOS, EOS_TEXT, CHAT_EOS, PAD, UNK = "<s>", "</s>", "<|im_end|>", "</s>", "<unk>"

# ChatML, as MiniCPM4.1 / Qwen3. Every tag strips the whitespace before it, so the output does not
# depend on trim_blocks / lstrip_blocks. Fast (non-reasoning) mode adds an empty think block after
# the generation prompt; it is chosen by enable_thinking=false (a hard switch) or, otherwise, by the
# most recent user message ending in /no_think (a soft switch; /think switches back). Reasoning of
# earlier assistant turns (before the last user message) is dropped from the history.
CHAT_TEMPLATE = """\
{%- if bos_token is defined and bos_token %}
    {{- bos_token }}
{%- endif %}
{%- set ns = namespace(fast=false, last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- set ns.last_user = loop.index0 %}
        {%- set text = message.content | trim %}
        {%- if text.endswith('/no_think') %}
            {%- set ns.fast = true %}
        {%- elif text.endswith('/think') %}
            {%- set ns.fast = false %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if enable_thinking is defined and enable_thinking is false %}
    {%- set ns.fast = true %}
{%- endif %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}
        {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if ns.fast %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""


QA = re.compile(r"^Question:\s*(?P<q>.+?)\s*\nAnswer:\s*(?P<a>.+)$", re.S)


def training_texts(text: str) -> list[str]:
    """What the BPE trainer counts: each paragraph with its blank-line separator, and each Q&A
    paragraph also as the ChatML exchange the demo model is trained on (same rule as
    train_demo_model.documents), so "\\n\\n", "user" and "assistant" get tokens of their own."""
    texts = []
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        texts.append(para + "\n\n")
        m = QA.match(para)
        if m:
            texts.append(f"<|im_start|>user\n{m['q']}<|im_end|>\n<|im_start|>assistant\n"
                         f"{m['a']}<|im_end|>\n")
    return texts


def build(corpus: Path = CORPUS):
    """The trained `tokenizers.Tokenizer` (no files written)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(THINK), min_frequency=2, show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL],
        initial_alphabet=sorted(pre_tokenizers.ByteLevel.alphabet()))
    texts = training_texts(corpus.read_text(encoding="utf-8"))
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK])
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1",
                                      special_tokens=[(BOS, bos)]),
    ])
    ids = [tok.token_to_id(t) for t in SPECIAL + THINK]
    expected = [0, 1, 2, 3, 4, VOCAB_SIZE - 2, VOCAB_SIZE - 1]
    if ids != expected or tok.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise RuntimeError(f"unexpected vocabulary: size {tok.get_vocab_size(with_added_tokens=True)}, "
                           f"special ids {ids} (want {expected}); is the corpus too small?")
    return tok


def tokenizer_config(tok) -> dict:
    decoder = tok.get_added_tokens_decoder()
    added = {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                      "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special}
             for i, t in sorted(decoder.items())}
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": BOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": CHAT_EOS,
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": PAD,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": UNK,
    }


def generation_config(tok) -> dict:
    return {
        "bos_token_id": tok.token_to_id(BOS),
        "do_sample": True,
        "eos_token_id": [tok.token_to_id(EOS_TEXT), tok.token_to_id(CHAT_EOS)],
        "pad_token_id": tok.token_to_id(PAD),
        "temperature": 0.6,
        "top_p": 0.95,
    }


def _dump(obj: dict) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def write(out: Path, corpus: Path = CORPUS) -> list[Path]:
    """Train and write the four tokenizer files into `out`; returns their paths."""
    tok = build(corpus)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": tok.to_str(pretty=True) + "\n",
        "tokenizer_config.json": _dump(tokenizer_config(tok)),
        "generation_config.json": _dump(generation_config(tok)),
        "chat_template.jinja": CHAT_TEMPLATE,
    }
    paths = []
    for name, text in files.items():
        path = out / name
        path.write_bytes(text.encode("utf-8"))  # no newline translation: byte-identical everywhere
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEMO, help="output folder (default: arkinfer/demo)")
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="training text (default: %(default)s)")
    args = ap.parse_args()
    for path in write(args.out, args.corpus):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
