"""From an OpenAI request to prompt token ids and a generation budget, checked against the
model's context before anything is queued. A prompt that cannot fit by its token bound is refused
before it is tokenized; the rest still takes up to a fraction of a second to tokenize, so callers
run these functions on a lane's thread, never on the event loop."""

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
    return _encode([text], request.budget(), model, "messages")


def completion_prompts(request: CompletionRequest, model: ServedModel) -> list[list[int]]:
    prompt = request.prompt
    if isinstance(prompt, str):
        prompts = _encode([prompt], request.budget(), model, "prompt")
    elif all(isinstance(p, str) for p in prompt):
        prompts = _encode([str(p) for p in prompt], request.budget(), model, "prompt")
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


def _encode(
    texts: list[str], requested: int | None, model: ServedModel, param: str
) -> list[list[int]]:
    """The texts' token ids, unless one of them cannot fit the context by its token bound."""
    if model.bound is not None:
        for text in texts:
            _check_fits(model.bound.least_tokens(text), requested, model, param, "at least ")
    return model.tokenizer.encode_many(texts)


def budget(prompts: list[list[int]], requested: int | None, model: ServedModel, param: str) -> int:
    """max_tokens: as requested, or the rest of the context, as vLLM does."""
    longest = max(len(p) for p in prompts)
    _check_fits(longest, requested, model, param)
    return requested if requested is not None else model.card.max_model_len - longest


def _check_fits(
    prompt: int, requested: int | None, model: ServedModel, param: str, qualifier: str = ""
) -> None:
    limit = model.card.max_model_len
    if prompt >= limit:
        raise InvalidRequest(
            f"this model's maximum context length is {limit} tokens; the prompt has "
            f"{qualifier}{prompt}",
            param=param,
            code="context_length_exceeded",
        )
    if requested is not None and prompt + requested > limit:
        raise InvalidRequest(
            f"this model's maximum context length is {limit} tokens; you requested "
            f"{qualifier}{prompt + requested} ({qualifier}{prompt} in the prompt, {requested} "
            "to generate)",
            param="max_tokens",
            code="context_length_exceeded",
        )
