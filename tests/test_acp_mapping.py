"""The ACP mapping's branches the client tests do not reach (issue 25, part 1): prompt
content blocks, stop reasons, unknown permission options, a result for a call never
shown, stored parts ACP has no place for, and the tool output cap. Pure functions."""

from __future__ import annotations

import pytest
from acp.schema import (
    BlobResourceContents,
    EmbeddedResourceContentBlock,
    ImageContentBlock,
    ResourceContentBlock,
    TextContentBlock,
    TextResourceContents,
)
from thinkray.runtime.acp.mapping import (
    OUTPUT_TEXT_LIMIT,
    PromptContentError,
    TurnTranslator,
    decision_of,
    history_updates,
    stop_reason,
    user_message,
)


def test_prompt_blocks_become_one_text_part_each():
    message = user_message(
        [
            TextContentBlock(type="text", text="look at"),
            ResourceContentBlock(type="resource_link", name="main.py", uri="file:///p/main.py"),
            EmbeddedResourceContentBlock(
                type="resource",
                resource=TextResourceContents(uri="file:///p/a.txt", text="hello"),
            ),
        ]
    )
    assert message["role"] == "user" and message["id"]
    assert [p["text"] for p in message["parts"]] == [
        "look at",
        "[@main.py](file:///p/main.py)",
        '<context uri="file:///p/a.txt">\nhello\n</context>',
    ]


@pytest.mark.parametrize(
    "block",
    [
        ImageContentBlock(type="image", data="AAAA", mime_type="image/png"),
        EmbeddedResourceContentBlock(
            type="resource", resource=BlobResourceContents(uri="file:///p/x.bin", blob="AAAA")
        ),
    ],
)
def test_content_the_agent_does_not_take_is_refused(block):
    with pytest.raises(PromptContentError):
        user_message([block])
    with pytest.raises(PromptContentError):
        user_message([])


def test_stop_reasons():
    assert stop_reason({"type": "finish", "finishReason": "stop"}) == "end_turn"
    assert stop_reason({"type": "finish", "finishReason": "length"}) == "max_tokens"
    assert stop_reason({"type": "finish", "finishReason": "content-filter"}) == "refusal"
    assert stop_reason({"type": "finish", "finishReason": "tool-calls"}) == "max_turn_requests"
    assert stop_reason({"type": "abort", "reason": "x"}) == "cancelled"
    assert stop_reason(None) == "end_turn"


def test_an_option_never_offered_is_a_refusal():
    assert [decision_of(o) for o in ("once", "session", "always", "deny")] == [
        "once",
        "session",
        "always",
        "deny",
    ]
    assert decision_of("allow_everything") == "deny"
    assert decision_of(None) == "deny"


def test_a_result_for_a_call_never_shown_starts_it_and_long_output_is_cut():
    turn = TurnTranslator()
    [update] = turn.updates(
        {
            "type": "tool-output-available",
            "toolCallId": "c1",
            "output": "x" * (OUTPUT_TEXT_LIMIT + 5),
        }
    )
    assert update.session_update == "tool_call" and update.status == "completed"
    assert update.raw_output == "x" * (OUTPUT_TEXT_LIMIT + 5)  # whole
    shown = update.content[0].content.text
    assert shown.startswith("x" * OUTPUT_TEXT_LIMIT) and shown.endswith("[... 5 more characters]")
    # Step boundaries, metadata and data chunks are not ACP updates.
    for chunk in ({"type": "start-step"}, {"type": "finish-step"}, {"type": "data-x", "data": 1}):
        assert turn.updates(chunk) == []


def test_history_leaves_out_what_acp_has_no_place_for():
    messages = [
        {"id": "s", "role": "system", "parts": [{"type": "text", "text": "sys"}]},
        {
            "id": "a",
            "role": "assistant",
            "parts": [
                {"type": "step-start"},
                {"type": "data-compaction", "data": {"summary": "we talked"}},
                {"type": "file", "url": "data:,x", "mediaType": "text/plain"},
                {
                    "type": "dynamic-tool",
                    "toolCallId": "c",
                    "toolName": "t",
                    "state": "input-available",
                    "input": {},
                },
            ],
        },
    ]
    updates = history_updates(messages)
    assert [u.session_update for u in updates] == ["agent_message_chunk", "tool_call"]
    assert updates[0].content.text == "[summary of earlier turns]\nwe talked"
    assert updates[1].status == "pending"  # a call that never finished
