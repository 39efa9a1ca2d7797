"""Versions recorded in and checked against every package."""

__version__ = "0.1.0"
# Bumped whenever the package layout or manifest changes incompatibly.
PACKAGE_FORMAT = 1
