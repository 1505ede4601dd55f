"""The one thing pyproject.toml cannot say: profiles/ sits at the top of the repository (where
`attnbench run --profile NAME` finds it in a clone) and is installed inside the package, as
attnbench/profiles, where an installed attnbench finds it (plan/profiles.py: PROFILE_DIR)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["attnbench", "attnbench.*"]), "attnbench.profiles"],
    package_dir={"attnbench.profiles": "profiles"},
)
