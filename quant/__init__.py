"""ArkInfer quantisation: calibration algorithms (calib/) and storage formats (formats/).

One canonical quantised weight (`QuantizedWeight`: codes, scales, zeros, bits, group size, sym,
g_idx) is produced by a calibrator (`quantize_rtn`, `quantize_ternary`; GPTQ/AWQ in calib/) and
repacked losslessly by a storage format (`formats.get_format(name).pack(qw)`), or refused with a
reason. A `QuantRecipe` names the pair; `get_preset("marlin")` etc. give the usual ones.
Algorithms and byte layouts: docs/quant.md.
"""

from .formats import FormatError, all_formats, get_format
from .recipe import PRESETS, QuantRecipe, get_preset
from .rtn import find_params, quantize_rtn, quantize_with
from .ternary import quantize_ternary
from .weight import Kind, QuantError, QuantizedWeight

__all__ = ["PRESETS", "FormatError", "Kind", "QuantError", "QuantRecipe", "QuantizedWeight",
           "all_formats", "find_params", "get_format", "get_preset", "quantize_rtn",
           "quantize_ternary", "quantize_with"]
