"""Maps the top-level algorithms/, backends/ and recipes/ folders into the rlzoo namespace.

Everything else about the distribution lives in pyproject.toml.
"""

from setuptools import find_packages, setup

ROOTS = {
    "rlzoo": "rlzoo",
    "rlzoo.algorithms": "algorithms",
    "rlzoo.backends": "backends",
    "rlzoo.recipes": "recipes",
}

packages = []
for namespace, folder in ROOTS.items():
    packages.append(namespace)
    packages += [
        f"{namespace}.{p}"
        for p in find_packages(folder)
        if not (namespace == "rlzoo" and p.split(".")[0] in {"algorithms", "backends", "recipes"})
    ]

setup(packages=packages, package_dir=ROOTS)
