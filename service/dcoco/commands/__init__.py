"""Subcommands of `dcoco`: each module has `configure(parser)` and `run(args)`."""
