"""Shared lowering services: the plumbing every backend's `lower` needs, written once.

A backend's own code is its real difference (its lowering, its runtime, its device specifics);
what every backend did by hand lives here, one idea a module:

    versions         version(package) -> str | None: toolchain versions for the manifest
    tokenizer_files  TOKENIZER_FILES and copy_tokenizer_files(src, out): the one list of
                     tokenizer / chat-template files an artifact or model folder carries
    source_weights   SourceWeights(model_dir): a float or quantised Hugging Face folder's
                     tensors, packed linears as stored (PackedLinear) or canonical
    hf_folder        HF_DIR and copy_hf_folder: the quantised folder an artifact keeps as `hf/`
    linears          linear_shapes(raw_config): every nn.Linear's (out, in) from config.json
    reference_folder cached_reference_folder(...): a float32 folder of an artifact's exact
                     weights, written once into ArkInfer's cache
    onnx_preflight   check_lowerable(...): what the ONNX lowering takes (onnx, tensorrt)
    program          program_of(request, source): the program build traced, or the model
                     traced now when the request carries none (onnx, coreml, tvm)
    program_ops      check_program_ops(program, backend, ops): refuse a program using an IR op
                     the backend does not declare (Capabilities.ops), naming ops and nodes

Nothing here imports a backend or a backend SDK (onnx, tvm, mlx, coremltools, gguf); modules are
imported one by one (`from arkinfer.lowering.versions import version`), so using one service
never pulls in another's dependencies.
"""
