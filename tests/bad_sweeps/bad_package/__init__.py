"""A package whose import fails: its __init__ runs even when only a submodule is named."""

raise RuntimeError("BAD_PACKAGE_CONFIG is not set")
