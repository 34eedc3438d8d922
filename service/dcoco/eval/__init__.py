"""Evaluating drafters on the embedded engine (`dcoco eval`, `make eval`): accepted length,
tokens/s and top-K coverage, for vanilla, DFlash and DCOCO's variants, per suite and setting."""
