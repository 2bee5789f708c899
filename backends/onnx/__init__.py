"""ONNX backend: one ONNX graph lowered from the IR, arkinfer-domain functions, onnxruntime runner."""
