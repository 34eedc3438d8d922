"""From an OpenAI request to prompt token ids and a generation budget, checked against the
model's context before anything is queued. Tokenizing a large prompt takes seconds: callers run
these functions on a worker thread, never on the event loop."""

from dcoco.gateway.catalog import ServedModel
from dcoco.gateway.errors import InvalidRequest
from dcoco.gateway.schemas import ChatRequest, CompletionRequest
from dcoco.tokenizer import TokenizerError


def chat_prompt(request: ChatRequest, model: ServedModel) -> list[list[int]]:
    messages = [
        {"role": m.role if m.role != "developer" else "system", "content": m.text()}
        for m in request.messages
    ]
    try:
        text = model.tokenizer.render_chat(messages)
    except TokenizerError as problem:
        raise InvalidRequest(str(problem), param="messages") from None
    return model.tokenizer.encode_many([text])


def completion_prompts(request: CompletionRequest, model: ServedModel) -> list[list[int]]:
    prompt = request.prompt
    if isinstance(prompt, str):
        prompts = model.tokenizer.encode_many([prompt])
    elif all(isinstance(p, str) for p in prompt):
        prompts = model.tokenizer.encode_many([str(p) for p in prompt])
    elif all(isinstance(p, int) for p in prompt):
        prompts = [[int(t) for t in prompt if isinstance(t, int)]]
    else:
        prompts = [list(p) for p in prompt if isinstance(p, list)]
    vocab = model.tokenizer.vocab_size
    for ids in prompts:
        if not ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        if max(ids) >= vocab:
            raise InvalidRequest(f"prompt token ids must be below {vocab}", param="prompt")
    return prompts


def budget(prompts: list[list[int]], requested: int | None, max_model_len: int) -> int:
    """max_tokens: as requested, or the rest of the context, as vLLM does."""
    longest = max(len(p) for p in prompts)
    room = max_model_len - longest
    if room < 1:
        raise InvalidRequest(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{longest}",
            param="messages",
            code="context_length_exceeded",
        )
    if requested is not None and requested > room:
        raise InvalidRequest(
            f"this model's maximum context length is {max_model_len} tokens; you requested "
            f"{longest + requested} ({longest} in the prompt, {requested} to generate)",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested if requested is not None else room
