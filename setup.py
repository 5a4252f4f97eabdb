"""Packaging: each top-level folder is installed under the project's prefix, so the wheel puts no
generic names (``training``, ``backend``, ``ui``) into site-packages (metadata: pyproject.toml)."""

from setuptools import find_packages, setup

#: installed package -> source folder (docs/architecture.md)
FOLDERS = {"aoq": "aoq", "aoq_cli": "cli", "aoq_train": "training", "aoq_serve": "backend", "aoq_ui": "ui"}

setup(
    package_dir={package: folder for package, folder in FOLDERS.items() if package != folder},
    packages=[f"{package}{'.' + sub if sub else ''}"
              for package, folder in FOLDERS.items() for sub in ["", *find_packages(folder)]],
)
