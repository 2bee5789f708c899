"""ArkInfer's custom ops, registered with torch.library under the `arkinfer` namespace.

Each op has a real reference implementation and a fake (shape) kernel, so `torch.export` keeps it
as one node and the traced graph still computes the right answer.
"""
