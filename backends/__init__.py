"""ArkInfer backends: one folder per backend, registered in the `arkinfer.backends` entry-point group."""
