"""Maps the top-level algorithms/, backends/, recipes/, tasks/ and from_verl/ folders into the rlzoo namespace.

Everything else about the distribution lives in pyproject.toml.
"""

from setuptools import find_packages, setup

ROOTS = {
    "rlzoo": "rlzoo",
    "rlzoo.algorithms": "algorithms",
    "rlzoo.backends": "backends",
    "rlzoo.recipes": "recipes",
    "rlzoo.tasks": "tasks",
    "rlzoo.from_verl": "from_verl",
}

packages = []
for namespace, folder in ROOTS.items():
    packages.append(namespace)
    packages += [
        f"{namespace}.{p}"
        for p in find_packages(folder)
        if not (namespace == "rlzoo" and f"rlzoo.{p.split('.')[0]}" in ROOTS)
    ]

setup(packages=packages, package_dir=ROOTS)
