"""Named compilation targets: one JSON file per target, read by ``compiler.targets``."""
