"""Packaging of the shipped configs; the project's metadata is in pyproject.toml.

The top-level ``configs/`` folder of the repository is the single source of the YAML configs: it
is installed as the package data of ``grpo_lightning.configs`` (``grpo_lightning.cli.resources``
finds it there, or in a checkout).
"""

from setuptools import find_namespace_packages, find_packages, setup

CONFIG_PACKAGE = "grpo_lightning.configs"
CONFIG_PACKAGES = [CONFIG_PACKAGE, *(f"{CONFIG_PACKAGE}.{name}" for name in find_namespace_packages("configs"))]

setup(
    packages=[*find_packages(include=["grpo_lightning*", "variants*"]), *CONFIG_PACKAGES],
    package_dir={CONFIG_PACKAGE: "configs"},
    package_data={package: ["*.yaml"] for package in CONFIG_PACKAGES},
)
