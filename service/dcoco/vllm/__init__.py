"""The vLLM side of DCOCO: a `vllm.general_plugins` entry point and the `vllm` worker engine.

- `plugin`: what vLLM calls in every process (version check, architecture registration, the V2
  speculator dispatch on GPUs). Cheap: nothing heavy is imported until vLLM loads a DCOCO model.
- `model`: the DCOCO drafter as a vLLM model class (vLLM's DFlash Qwen3 drafter plus our
  corrector, with per-layer context k_norm).
- `runtime`: the draft selection and its bookkeeping, in plain torch over `dcoco.spec`.
- `hooks`: the V1 runner hook points (`_sample_draft_tokens` and the step timing around it).
- `speculator`: the V2 (GPU) speculator, following vLLM's DFlash2 / LiLiCorr pattern.
- `client`, `engine_args`: `VllmEngineClient`, AsyncLLM behind the worker's engine protocol.
- `spec_config`: the speculative config every DCOCO drafter starts vLLM with.
- `export`: drafter folders vLLM loads (`dcoco export-drafter`).

Only the worker's engine factory and the `export-drafter` command import this package; the
gateway, queue, settings and shared layers never do.
"""
