"""Chat prompts as token ids: the tokenizer's chat template, with a fallback for tools.

Contract:
- `encode_chat(tokenizer, messages, tools, model_name=...)` returns the token ids of `messages`
  in the tokenizer's chat template, ending with the assistant header (the generation prompt).
- Tools always reach the model: a template that rejects or ignores them (renders the same ids
  with and without them) gets them as JSON schemas in a leading system message instead.
- Every malformed chat raises `PromptError`: not a list of mappings, all contents blank, no chat
  template, or a template that rejects the messages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from oilbird.errors import PromptError


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of multi-part content."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multi-part content: [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return ""


def _template(tokenizer, messages: list[dict], tools: list | None, model_name: str) -> list[int]:
    """The template's token ids for `messages` (and `tools`), with the generation prompt."""
    from jinja2 import TemplateError

    try:
        out: Any = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True)
    except TemplateError as e:
        raise PromptError(f"the chat template of {model_name} rejected the messages: {e}") from e
    if isinstance(out, Mapping):  # transformers 5.x returns a BatchEncoding
        out = out["input_ids"]
    return [int(i) for i in out]


def encode_chat(tokenizer, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None,
                *, model_name: str = "the model") -> list[int]:
    """Token ids of `messages` in the chat template, ending with the assistant header.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        messages: `{"role": ..., "content": ...}` mappings.
        tools: JSON tool schemas. A template that rejects or ignores them gets them as JSON
            in a leading system message instead, so the model always sees them.
        model_name: the model's name, for error messages.
    Returns:
        the prompt's token ids.
    Raises:
        PromptError: no messages, all contents empty, messages the template rejects, or a
            tokenizer without a chat template.
    """
    if isinstance(messages, (str, bytes)) or not all(isinstance(m, Mapping) for m in messages):
        raise PromptError("messages must be a list of {'role': ..., 'content': ...} mappings.")
    msgs = [dict(m) for m in messages]
    if not any(_text_of(m.get("content")).strip() for m in msgs):
        raise PromptError("the chat is empty: give a message with non-blank content.")
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError(f"model {model_name} has no chat template; send a raw prompt instead.")
    if tools:
        try:
            with_tools = _template(tokenizer, msgs, list(tools), model_name)
            if with_tools != _template(tokenizer, msgs, None, model_name):
                return with_tools
        except (PromptError, TypeError, ValueError, KeyError):
            pass  # the template cannot render tools: fall back to a system message
        schemas = json.dumps(list(tools), ensure_ascii=False)
        listing = f"You can call these tools (JSON schemas):\n{schemas}"
        if msgs and msgs[0].get("role") == "system":
            msgs[0]["content"] = f"{_text_of(msgs[0].get('content'))}\n\n{listing}"
        else:
            msgs.insert(0, {"role": "system", "content": listing})
    return _template(tokenizer, msgs, None, model_name)
