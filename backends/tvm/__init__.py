"""The tvm backend: ArkInfer IR -> Relax/TIR -> OpenCL (Android) + llvm (host). See README.md."""
