"""llama.cpp's decoding time on a GGUF file, in a process of its own.

    python -m dcoco.bench.llama_timing GGUF TOKENS THREADS {extra,plain} < prompt ids (JSON)

prints llama.cpp's milliseconds per decoded token: greedy, eval only, after the prompt and a few
warm-up tokens, the wrapper's sampling left out (as our step's sampling is in).

`extra` loads the model as llama-cpp-python does by default, with llama.cpp's extra buffer
types: its CPU backend's AMX and repacked-weight kernels. `plain` loads it without them. A
separate process, because llama.cpp's AMX path crashed (SIGSEGV) on an Intel Xeon with AMX in
a VM here, where torch's oneDNN ran AMX fine: a crash must cost the benchmark one figure, not
the run (`bench.core_parts.llama_cpp_ms`).
"""

import json
import statistics
import sys
import time
from pathlib import Path

WARMUP_TOKENS = 8


def decode_ms(gguf: Path, prompt: list[int], tokens: int, threads: int, extra: bool) -> float:
    import llama_cpp  # an optional benchmark dependency
    from llama_cpp import llama as high_level

    defaults = llama_cpp.llama_model_default_params

    def params() -> llama_cpp.llama_model_params:
        chosen = defaults()
        chosen.use_extra_bufts = extra
        return chosen

    # The high-level Llama takes the model's parameters from this function and exposes no
    # switch for extra buffer types.
    high_level.llama_cpp.llama_model_default_params = params  # type: ignore[attr-defined,unused-ignore]
    llm = high_level.Llama(
        model_path=str(gguf), n_ctx=1024, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    llm.eval(prompt)
    spent = []
    for _ in range(WARMUP_TOKENS + tokens):
        token = int(llm.scores[llm.n_tokens - 1].argmax())
        start = time.perf_counter()
        llm.eval([token])
        spent.append(time.perf_counter() - start)
    return 1000 * statistics.mean(spent[WARMUP_TOKENS:])


def main() -> None:
    gguf, tokens, threads, kind = sys.argv[1:]
    prompt = json.load(sys.stdin)
    print(decode_ms(Path(gguf), prompt, int(tokens), int(threads), kind == "extra"))


if __name__ == "__main__":
    main()
