"""The bottom layer: the names every side of the project shares.

Modes, selection rules, engine settings, sampling parameters, speculation statistics, the
engine-client protocol and `UsageError`. Nothing here imports torch, the CLI or any other
`dcoco` package, so the gateway, the queue and the settings can use it without loading an engine.
"""
