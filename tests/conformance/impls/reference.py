"""The InfLLM v2 reference (masked dense, O(T * S)): the yardstick, run through the suite too."""

from infllmv2_checks import Infllmv2Impl

from arkinfer.ops.infllmv2 import reference

IMPL = Infllmv2Impl("reference", reference.infllmv2_attention, tracks_memory=False,
                    sparse_is_fast=False, is_reference=True)
