"""The README's examples run: every ```python block, in order, as a reader would run them.

The blocks build on each other (the agent defined first is hosted on Ray later), so they
run in one shared namespace, like the examples of one doctest file, each with a fresh
temporary directory as its working directory. A block preceded by an HTML comment
``<!-- not-tested: reason -->`` is skipped (keep those rare); shell blocks are not run.

``AnthropicModel`` really runs: the real ``anthropic`` SDK talks to the local fake API
server (tests/fake_anthropic.py) through ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``,
which the README forwards to its actors with ``runtime_env``, as it tells users to.
The fake answers from the request itself (see :func:`answer`), so the README's prompts
need no script. Ray is the suite's shared local instance: the README's
``ray.init(ignore_reinit_error=True)`` joins it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import threading
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_anthropic import FakeAnthropicServer, RecordedRequest, message, text, tool_use

README = Path(__file__).resolve().parent.parent / "README.md"
SETUP = 'pip install . && thinkray demo\npip install ".[dev]" && bash .ci/browser && python -m pytest -q'
NOT_TESTED = re.compile(r"<!--\s*not-tested:\s*(\S.*?)\s*-->\s*$")


@dataclass
class Block:
    language: str
    source: str
    line: int  # the line of the opening fence, 1-based
    skip_reason: str | None


def readme_blocks(path: Path = README) -> list[Block]:
    """The fenced code blocks of ``path``, with the not-tested marker before each."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})\s*([\w+-]*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start, ticks, language = i, fence.group(1), fence.group(2).lower()
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != ticks:
            body.append(lines[i])
            i += 1
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_TESTED.match(previous.strip())
        blocks.append(
            Block(language, "\n".join(body) + "\n", start + 1, marker.group(1) if marker else None)
        )
        i += 1
    return blocks


# -- the fake model ----------------------------------------------------------------------


def _content(msg: dict[str, Any]) -> list[dict[str, Any]]:
    content = msg.get("content") or []
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return " ".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content)


def answer(body: dict[str, Any]) -> Any:
    """A model that answers from the request, enough for the README's prompts:

    - after tool results: a short answer quoting them;
    - "weather in <City>" with a ``get_weather`` tool: calls it;
    - a ``*.md`` path with a ``shared_read_file`` tool: reads it;
    - "long" in the prompt: a slow stream of 400 words (something to abort);
    - anything else: a one-line answer."""
    messages = body.get("messages") or []
    tools = {t.get("name") for t in body.get("tools") or []}
    blocks = _content(messages[-1]) if messages else []
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if results:
        quoted = "; ".join(_result_text(b) for b in results)
        return message(text(f"Here is what I found: {quoted}"))
    prompt = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    call_id = f"toolu_{uuid.uuid4().hex[:16]}"
    weather = re.search(r"weather in ([A-Z][a-z]+)", prompt)
    if weather and "get_weather" in tools:
        call = tool_use(call_id, "get_weather", {"city": weather.group(1)})
        return message(text("Let me check."), call, stop_reason="tool_use")
    path = re.search(r"\b([\w/-]+\.md)\b", prompt)
    if path and "shared_read_file" in tools:
        call = tool_use(call_id, "shared_read_file", {"path": path.group(1)})
        return message(call, stop_reason="tool_use")
    if "long" in prompt.lower():
        return message(text(" ".join(["word"] * 400), chunks=200), delay=0.02)
    return message(text(f"Noted: {prompt}"))


class AnsweringServer(FakeAnthropicServer):
    """The fake API; with nothing scripted it answers each request with :func:`answer`."""

    def __init__(self) -> None:
        super().__init__()
        self._current = threading.local()  # the handler thread's request

    def _record(self, request: RecordedRequest) -> None:
        super()._record(request)
        self._current.request = request

    def _next_response(self) -> Any:
        with self._lock:
            if self._queue:
                return self._queue.pop(0)
        body = self._current.request.body
        return answer(body if isinstance(body, dict) else {})


@pytest.fixture
def model_server(monkeypatch):
    with AnsweringServer() as server:
        for key in list(os.environ):
            if key.startswith("ANTHROPIC_"):
                monkeypatch.delenv(key)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-readme-test")
        yield server


# -- the tests ---------------------------------------------------------------------------


def test_the_readme_opens_with_the_two_setup_commands():
    text_ = README.read_text(encoding="utf-8")
    first = readme_blocks()[0]
    assert text_.startswith("# thinkray\n\n```bash\n")
    assert first.language == "bash" and first.source.strip() == SETUP


def test_the_readme_stands_alone():
    text_ = README.read_text(encoding="utf-8")
    assert "../" not in text_ and "shared/" not in text_, "a reference outside the repository"
    assert "DESIGN.md" not in text_ and "seeds/" not in text_
    for path in re.findall(r"`((?:tests|runtime|actors|storage)/[\w/.]*\.py)`", text_):
        assert (README.parent / path).exists(), path


def test_the_names_the_imports_section_lists_are_public():
    section = README.read_text(encoding="utf-8").split("## Imports", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"`(thinkray(?:\.\w+)+)`:((?:\s*`\w+`,?)+)", section)
    assert len(listed) >= 4
    for module_name, names in listed:
        module = importlib.import_module(module_name)
        public = getattr(module, "__all__", None)
        for name in re.findall(r"`(\w+)`", names):
            assert hasattr(module, name), f"{module_name}.{name}"
            assert public is None or name in public, f"{name} not in {module_name}.__all__"


def test_every_python_block_is_run_or_says_why_not():
    python = [b for b in readme_blocks() if b.language in ("python", "py")]
    assert len(python) >= 8
    skipped = [b for b in python if b.skip_reason]
    assert len(skipped) <= 2, [b.line for b in skipped]
    for block in python:
        compile(block.source, f"README.md:{block.line}", "exec")  # at least it parses


def test_the_readme_python_blocks_run(ray_local, model_server, tmp_path, namespace_test_defaults):
    # The blocks' namespaces keep no spare and skip the warm-up turn, as every test's
    # do (tests/conftest.py): the pool's defaults have tests of their own
    # (test_directory_pool.py), and here each spare was a process started for nothing.
    from thinkray.actors import AgentNamespace, Orchestrator

    python = [b for b in readme_blocks() if b.language in ("python", "py") and not b.skip_reason]
    scope: dict[str, Any] = {"__name__": "readme_example"}
    here = os.getcwd()
    try:
        for block in python:
            workdir = tmp_path / f"block-{block.line}"
            workdir.mkdir()
            os.chdir(workdir)
            failure = None
            try:
                exec(compile(block.source, f"README.md:{block.line}", "exec"), scope)
            except Exception as exc:
                failure = "".join(traceback.format_exception(exc))
            finally:
                os.chdir(here)
            if failure is not None:
                pytest.fail(f"README.md block at line {block.line} failed:\n{failure}", False)
        # What the blocks claim happened, checked from outside.
        assert model_server.requests, "the AnthropicModel examples never reached the fake API"
        bodies = [json.dumps(b) for b in model_server.bodies]
        assert any('"get_weather"' in b for b in bodies)
        assert any("brief.md" in b for b in bodies)  # the sub-agent read the shared file
    finally:
        os.chdir(here)
        # A failed block leaves its namespaces up: stop them (the README's last block
        # does it when everything ran).
        for value in list(scope.values()):
            if isinstance(value, AgentNamespace):
                if value.agent_cls is not None and issubclass(value.agent_cls, Orchestrator):
                    for name in value.names():
                        with contextlib.suppress(Exception):
                            AgentNamespace.connect(f"{value.name}.{name}.subs").shutdown()
                with contextlib.suppress(Exception):
                    value.shutdown()
