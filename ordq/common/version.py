"""The version of ordq (pyproject.toml's; ``ordq.__version__``), at the ground so that a broker
and a coordinator can report it (``ordq status``) without importing the package's top."""

VERSION = "0.1.0"
