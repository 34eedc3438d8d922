"""The worker: consumes a model's request stream and drives one engine."""
