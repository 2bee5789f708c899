"""ArkInfer quantisation: calibration algorithms (calib/) and storage formats (formats/)."""
