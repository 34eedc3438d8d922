"""The tokenizer of a model folder: `tokenizer.json` plus `tokenizer_config.json`'s chat template.

It needs neither torch nor transformers, so the gateway can count prompt tokens with it.
"""

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

# ChatML, as Qwen3 uses it; message content is plain text.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
END_OF_TEXT, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END, MASK]


class TokenizerError(ValueError):
    pass


class Tokenizer:
    def __init__(
        self, inner: HFTokenizer, chat_template: str | None, eos_tokens: list[str]
    ) -> None:
        self.inner = inner
        self.chat_template = chat_template
        self._template: Template | None = None
        self.eos_token_ids = tuple(
            i for i in (inner.token_to_id(t) for t in eos_tokens) if i is not None
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        folder = Path(path)
        try:
            inner = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as bad:  # noqa: BLE001 - the Rust side raises plain Exception
            raise TokenizerError(f"{folder / 'tokenizer.json'}: unreadable ({bad})") from None
        config_file = folder / "tokenizer_config.json"
        config: dict[str, Any] = {}
        if config_file.exists():
            try:
                config = json.loads(config_file.read_text())
            except json.JSONDecodeError as bad:
                raise TokenizerError(f"{config_file}: not valid JSON ({bad})") from None
        eos = [t for t in (config.get("eos_token"), END_OF_TEXT, IM_END) if isinstance(t, str)]
        return cls(inner, config.get("chat_template"), eos)

    @property
    def vocab_size(self) -> int:
        return int(self.inner.get_vocab_size())

    def token_id(self, token: str) -> int:
        found = self.inner.token_to_id(token)
        if found is None:
            raise TokenizerError(f"the tokenizer has no token {token!r}")
        return int(found)

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=False).ids)

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """Like `encode` for each text, but releases the GIL while it tokenizes (the Rust side
        of `encode_batch` does, `encode` does not): use it off the event loop."""
        return [list(e.ids) for e in self.inner.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return str(self.inner.decode(list(ids), skip_special_tokens=True))

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for a conversation, ending with the assistant's turn opening."""
        if self.chat_template is None:
            raise TokenizerError("this tokenizer has no chat template")
        try:
            if self._template is None:  # compiled once: compiling costs far more than rendering
                env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                self._template = env.from_string(self.chat_template)
            return self._template.render(messages=messages, add_generation_prompt=True)
        except TemplateError as bad:
            raise TokenizerError(f"the chat template failed: {bad}") from None


def chat_prompt(tokenizer: Tokenizer, user: str) -> str:
    """The prompt of a one-message conversation, as training and evaluation render it."""
    return tokenizer.render_chat([{"role": "user", "content": user}])


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> HFTokenizer:
    """A byte-level BPE with the chat and mask special tokens first (ids 0..3)."""
    inner = HFTokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    inner.train_from_iterator(texts, trainer)
    return inner


def save_tokenizer(inner: HFTokenizer, path: str | Path) -> None:
    """tokenizer.json plus a tokenizer_config.json that transformers' AutoTokenizer reads."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    inner.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "bos_token": None,
        "mask_token": MASK,
        "additional_special_tokens": [IM_START, IM_END],
        "model_max_length": 4096,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
