"""ArkInfer: an edge-deployment compiler for small LLMs (MiniCPM4 with InfLLM v2, Llama family)."""

__version__ = "0.1.0"
