"""CUDA kernels of the tensorrt backend (part 2 of issue #9): sources, their nvcc build and ctypes
bindings. Nothing here is imported by the package at install time; CUDA is compiled on use only."""
