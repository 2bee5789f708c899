"""Package discovery for ArkInfer's layout (metadata lives in pyproject.toml).

`backends/` and `quant/` are top-level folders that import as `arkinfer.backends` and
`arkinfer.quant`; `targets/` ships its TOML device profiles as `arkinfer.target_profiles`.
"""

from setuptools import find_packages, setup

ROOTS = {
    "arkinfer": "arkinfer",
    "arkinfer.backends": "backends",
    "arkinfer.quant": "quant",
    "arkinfer.target_profiles": "targets",
}


def _packages() -> tuple[list[str], dict[str, str]]:
    packages, package_dir = [], {}
    for name, folder in ROOTS.items():
        packages.append(name)
        package_dir[name] = folder
        for sub in find_packages(folder):
            packages.append(f"{name}.{sub}")
            package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"
    return packages, package_dir


packages, package_dir = _packages()
setup(packages=packages, package_dir=package_dir)
