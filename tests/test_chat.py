"""Chat prompts (oilbird.chat) through the real default model's chat template."""

from __future__ import annotations

import pytest

from oilbird.errors import PromptError


def test_encode_chat_ends_with_assistant_header(smol):
    ids = smol.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    raw = smol.tokenizer.decode(ids, skip_special_tokens=False)
    assert "What is the capital of France?" in raw
    assert raw.endswith("<|im_start|>assistant\n")
    assert "What is the capital of France?" in smol.decode(ids)


def test_tools_reach_the_prompt_even_if_the_template_ignores_them(smol):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    text = smol.decode(smol.encode_chat([{"role": "user", "content": "Weather?"}], tools=tools))
    assert "get_weather" in text


@pytest.mark.parametrize("messages", [[], [{"role": "user", "content": " \n"}], [{"role": "user"}]])
def test_empty_chat_is_rejected(smol, messages):
    with pytest.raises(PromptError):
        smol.encode_chat(messages)
