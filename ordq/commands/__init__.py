"""Subcommands of the ordq CLI, one module each; each has register(subparsers)."""
