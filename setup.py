"""Packaging of the shipped configs and the presets; the project's metadata is in pyproject.toml.

Two top-level folders of the repository are installed inside the package, so that a wheel holds
``grpo_lightning`` alone: ``configs/`` (the single source of the YAML configs) as the package data of
``grpo_lightning.configs`` (``grpo_lightning.cli.resources`` finds it there, or in a checkout), and
``variants/`` (the presets, one file per paper) as ``grpo_lightning.variants``. In a checkout,
``grpo_lightning/variants/__init__.py`` stands in for the latter; it is not installed.
"""

from setuptools import find_namespace_packages, find_packages, setup

CONFIG_PACKAGE = "grpo_lightning.configs"
CONFIG_PACKAGES = [CONFIG_PACKAGE, *(f"{CONFIG_PACKAGE}.{name}" for name in find_namespace_packages("configs"))]
VARIANTS_PACKAGE = "grpo_lightning.variants"
VARIANTS_PACKAGES = [VARIANTS_PACKAGE, *(f"{VARIANTS_PACKAGE}.{name}" for name in find_packages("variants"))]

setup(
    packages=sorted({*find_packages(include=["grpo_lightning*"]), *VARIANTS_PACKAGES, *CONFIG_PACKAGES}),
    package_dir={CONFIG_PACKAGE: "configs", VARIANTS_PACKAGE: "variants"},
    package_data={package: ["*.yaml"] for package in CONFIG_PACKAGES},
)
