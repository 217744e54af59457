"""Token usage: one shape, mapped from each provider in exactly one place.

``input`` EXCLUDES cache tokens everywhere in thinkray. Anthropic already reports it
that way (total input = input_tokens + cache_creation + cache_read); the AI SDK's
``inputTokens`` includes them, so :meth:`Usage.from_ai_sdk` subtracts. Seed 002: the
recorder bumps rollups from per-step usage only, never from finish-step chunks.
"""

from __future__ import annotations

from typing import Any

from thinkray.runtime.typed_model import TypedModel


class Usage(TypedModel):
    """Tokens of one step (or a sum of steps; ``+`` adds them). ``input`` excludes
    the cache tokens; ``cost_usd`` is None unless a provider reported a cost."""

    input: int = 0
    output: int = 0
    reasoning: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost_usd: float | None = None

    @property
    def total(self) -> int:
        """Every token counted: input, output, reasoning and both cache counts."""
        return self.input + self.output + self.reasoning + self.cache_read + self.cache_write

    def __add__(self, other: Usage) -> Usage:
        cost = None
        if self.cost_usd is not None or other.cost_usd is not None:
            cost = (self.cost_usd or 0.0) + (other.cost_usd or 0.0)
        return Usage(
            input=self.input + other.input,
            output=self.output + other.output,
            reasoning=self.reasoning + other.reasoning,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            cost_usd=cost,
        )

    def to_dict(self) -> dict[str, Any]:
        """The five counts (what ``SessionStore.add_usage`` takes), plus ``cost_usd``
        when known."""
        d: dict[str, Any] = {
            "input": self.input,
            "output": self.output,
            "reasoning": self.reasoning,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
        }
        if self.cost_usd is not None:
            d["cost_usd"] = self.cost_usd
        return d

    @classmethod
    def from_anthropic(cls, usage: Any) -> Usage:
        """Map an Anthropic ``Usage``/``MessageDeltaUsage`` (object or dict)."""

        def get(name: str) -> int:
            value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
            return int(value or 0)

        # Anthropic's input_tokens already excludes cache reads and writes. Thinking
        # tokens are billed inside output_tokens; when the API reports them apart
        # (output_tokens_details.thinking_tokens) they move to ``reasoning`` so the two
        # are never counted twice.
        details = (
            usage.get("output_tokens_details")
            if isinstance(usage, dict)
            else getattr(usage, "output_tokens_details", None)
        )
        thinking = 0
        if details is not None:
            value = (
                details.get("thinking_tokens")
                if isinstance(details, dict)
                else getattr(details, "thinking_tokens", None)
            )
            thinking = int(value or 0)
        output = get("output_tokens")
        return cls(
            input=get("input_tokens"),
            output=max(0, output - thinking),
            reasoning=min(thinking, output) if output else thinking,
            cache_read=get("cache_read_input_tokens"),
            cache_write=get("cache_creation_input_tokens"),
        )

    @classmethod
    def from_ai_sdk(cls, usage: dict[str, Any]) -> Usage:
        """Map AI SDK usage, whose ``inputTokens`` INCLUDES cache reads and writes."""
        details = usage.get("inputTokenDetails") or {}
        cache_read = int(details.get("cacheReadTokens") or usage.get("cachedInputTokens") or 0)
        cache_write = int(details.get("cacheWriteTokens") or 0)
        output_details = usage.get("outputTokenDetails") or {}
        reasoning = int(output_details.get("reasoningTokens") or usage.get("reasoningTokens") or 0)
        output = int(usage.get("outputTokens") or 0)
        return cls(
            input=max(0, int(usage.get("inputTokens") or 0) - cache_read - cache_write),
            output=max(0, output - reasoning),
            reasoning=reasoning,
            cache_read=cache_read,
            cache_write=cache_write,
        )
