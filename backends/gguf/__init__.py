"""GGUF backend: GGUF files for llama.cpp, run on the host through llama-cpp-python."""
