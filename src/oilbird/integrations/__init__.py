"""Oilbird's drafters inside other inference engines (today: vLLM, in `oilbird.integrations.vllm`)."""
