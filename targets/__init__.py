"""Device profiles as TOML data (one file per target); loaded by `arkinfer.targets`."""
