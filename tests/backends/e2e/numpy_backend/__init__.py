"""A test backend that lives outside ArkInfer: its lowering writes the model's float weights as
one numpy `.npz`, its runtime runs ArkInfer's reference model over them. It registers the way a
third party's backend does (one `arkinfer.backends` entry point, see ../conftest.py) and joins
the end-to-end suite without a line changed in arkinfer/ or backends/.

Its InfLLM v2 operator is its own numpy code (`infllmv2.py`), held to the conformance suite by
tests/conformance/impls/numpy_backend.py. The runner still runs the reference model's attention:
the model has no public hook that takes another InfLLM v2 implementation."""
