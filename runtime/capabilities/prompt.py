"""System prompt assembly (seed 002 "System prompt assembly").

Every turn assembles a fresh prompt from five sections, in this normative order:

1. ``# Agent`` — the agent manifest prompt.
2. ``# Project instructions`` — ``AGENTS.md``, ``CLAUDE.md`` and ``CONTEXT.md`` found
   in the workspace on the way from the root to the working directory.
3. ``# Skills`` — one line per ``skills/<name>/SKILL.md`` (name and the front
   matter's ``description``; bodies load on demand).
4. ``# Environment`` — platform, workspace root, working directory, git status (when
   the host supplies it), current date, resolved model and variant.
5. ``# Tools`` — name, description and JSON Schema of every active tool.

An empty section is left out (its heading too); the others never move. The digest is
the SHA-256 of the assembled text, so two assemblies of the same inputs produce the
same digest, and any change in any section changes it.

The instructions walk. The seed says "walked from the outermost file inward
(nearest-last, so the project root has the final word)". The two halves only agree
when the working directory is the project root, so we implement the unambiguous
part: files are concatenated outermost first, the file nearest the working directory
last. Read top to bottom the later text refines the earlier — the nearest file has the
final word; host-level instructions (``global_instructions``, outside the workspace)
come before the workspace root's. Within one directory the order is ``AGENTS.md``,
``CLAUDE.md``, ``CONTEXT.md``. A missing file, directory or workspace is not an error.

Determinism: tools are listed by name with their schemas as sorted compact JSON; the
date is a day (not a timestamp) and injectable, so a turn's digest is stable within a
day for the same inputs.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from thinkray.runtime.tools.paths import normalize_path
from thinkray.runtime.tools.workspace import call_op

if TYPE_CHECKING:
    from thinkray.runtime.agents.runs import ChatOptions
    from thinkray.runtime.capabilities.host import PromptHost

log = logging.getLogger("thinkray.prompt")

INSTRUCTION_FILES: tuple[str, ...] = ("AGENTS.md", "CLAUDE.md", "CONTEXT.md")
SKILLS_DIR = "skills"
SKILL_FILE = "SKILL.md"

SECTION_TITLES: tuple[str, ...] = (
    "Agent",
    "Project instructions",
    "Skills",
    "Environment",
    "Tools",
)
"""The normative order; implementations MUST NOT shuffle it."""


@dataclass(frozen=True)
class InstructionFile:
    """One file of the ``# Project instructions`` section and its stripped text."""

    path: str  # workspace path ("AGENTS.md", "pkg/app/CLAUDE.md") or a host label
    content: str


@dataclass(frozen=True)
class Skill:
    """One line of the ``# Skills`` section: a skill's name, the front matter's
    ``description`` and the workspace path of its ``SKILL.md``."""

    name: str
    description: str
    path: str


@dataclass(frozen=True)
class AssembledPrompt:
    """A turn's system prompt: its ``text``, the ``digest`` that identifies it and the
    non-empty sections it was built from, in order."""

    text: str
    digest: str  # hex SHA-256 of ``text``
    sections: tuple[tuple[str, str], ...]  # (title, body) of the non-empty sections


def digest_of(text: str) -> str:
    """The SHA-256 hex digest of a prompt's text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- the sections ------------------------------------------------------------------------


def _dirs_outermost_first(cwd: str) -> list[str]:
    cwd = normalize_path(cwd, allow_root=True) if cwd else ""
    dirs = [""]
    if cwd:
        parts = cwd.split("/")
        dirs += ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return dirs


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


async def _read_optional(ws: Any, path: str) -> str | None:
    try:
        info = await call_op(ws, "stat", path)
    except Exception:  # an unsafe or unreadable path is "not there" for the prompt
        return None
    if not info or info.get("type") != "file":
        return None
    try:
        return await call_op(ws, "read_file", path)
    except Exception as exc:
        log.warning("cannot read %s for the system prompt: %s", path, exc)
        return None


async def find_project_instructions(ws: Any, cwd: str = "") -> list[InstructionFile]:
    """Instruction files from the workspace root down to ``cwd`` (outermost first)."""
    if ws is None:
        return []
    found: list[InstructionFile] = []
    for directory in _dirs_outermost_first(cwd):
        for name in INSTRUCTION_FILES:
            path = _join(directory, name)
            content = await _read_optional(ws, path)
            if content is not None and content.strip():
                found.append(InstructionFile(path, content.strip()))
    return found


def parse_front_matter(text: str) -> dict[str, str]:
    """``key: value`` lines between leading ``---`` fences (a small YAML subset)."""
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    meta: dict[str, str] = {}
    for line in lines[1:]:
        if line.strip() == "---":
            return meta
        if ":" in line and not line.startswith((" ", "\t")):
            key, value = line.split(":", 1)
            meta[key.strip()] = value.strip().strip("\"'")
    return {}  # no closing fence: not front matter


async def discover_skills(ws: Any, skills_dir: str = SKILLS_DIR) -> list[Skill]:
    """``<skills_dir>/<name>/SKILL.md`` files, by name. Only the front matter is used:
    ``name`` (default: the directory) and ``description`` (its first line)."""
    if ws is None:
        return []
    try:
        entries = await call_op(ws, "list_directory", skills_dir)
    except Exception:
        return []
    skills: list[Skill] = []
    for entry in entries:
        if entry.get("type") != "directory":
            continue
        path = _join(entry["path"], SKILL_FILE)
        content = await _read_optional(ws, path)
        if content is None:
            continue
        meta = parse_front_matter(content)
        description = (meta.get("description") or "").strip().splitlines()
        skills.append(
            Skill(
                name=meta.get("name") or entry["name"],
                description=description[0] if description else "",
                path=path,
            )
        )
    return sorted(skills, key=lambda s: s.name)


def render_instructions(files: Iterable[InstructionFile]) -> str:
    """Section 2: the project instruction files, outermost first."""
    return "\n\n".join(f"## {f.path}\n\n{f.content}" for f in files)


def render_skills(skills: Iterable[Skill]) -> str:
    """Section 3: the skills catalog (name and description)."""
    lines = []
    for s in skills:
        desc = f": {s.description}" if s.description else ""
        lines.append(f"- {s.name}{desc} ({s.path})")
    if not lines:
        return ""
    return "Load a skill's full instructions by reading its file when it applies.\n\n" + "\n".join(
        lines
    )


def render_environment(env: Mapping[str, Any]) -> str:
    """Section 4: the environment's key/values (None values omitted)."""
    return "\n".join(f"- {key}: {value}" for key, value in env.items() if value not in (None, ""))


def render_tools(tools: Mapping[str, Any]) -> str:
    """Section 5: the tool catalog (name, description, input schema)."""
    blocks = []
    for name in sorted(tools):
        t = tools[name]
        schema = json.dumps(
            getattr(t, "input_schema", {}) or {},
            sort_keys=True,
            separators=(",", ":"),
            default=str,
        )
        desc = (getattr(t, "description", "") or "").strip()
        blocks.append(
            f"## {name}\n\n" + (f"{desc}\n\n" if desc else "") + f"Input schema: {schema}"
        )
    return "\n\n".join(blocks)


def assemble_system_prompt(
    *,
    manifest: str = "",
    instructions: Iterable[InstructionFile] = (),
    skills: Iterable[Skill] = (),
    environment: Mapping[str, Any] | None = None,
    tools: Mapping[str, Any] | None = None,
) -> AssembledPrompt:
    """The five sections in the normative order, each under its ``#`` heading."""
    bodies = (
        (manifest or "").strip(),
        render_instructions(instructions),
        render_skills(skills),
        render_environment(environment or {}),
        render_tools(tools or {}),
    )
    sections = tuple(
        (title, body) for title, body in zip(SECTION_TITLES, bodies, strict=True) if body
    )
    text = "\n\n".join(f"# {title}\n\n{body}" for title, body in sections)
    return AssembledPrompt(text=text, digest=digest_of(text), sections=sections)


# -- the mixin --------------------------------------------------------------------------


_STATE_KEY = "prompt.assembled"  # ChatOptions.state: this turn's AssembledPrompt


class PromptAssembly:
    """Assembles the system prompt from the five sections and records its digest,
    attached to an agent by composition (``agent.prompts``;
    :class:`~thinkray.runtime.agents.agent.Agent` builds one). Works against
    :class:`~thinkray.runtime.capabilities.host.PromptHost`: the agent's workspace,
    model and tools, plus its ``get_manifest_prompt()`` (section 1),
    ``global_instructions`` (host-level instruction text before the workspace's files),
    ``get_working_directory()`` (where the instructions walk ends), ``skills_dir`` and
    ``get_environment(model, variant)`` (the environment section's key/values, for
    the turn's model and variant).

    ``await assemble_prompt(tools)`` returns the :class:`AssembledPrompt`;
    ``system_prompt_for(options, tools)`` and ``message_metadata(options)`` are the turn
    hooks (the digest lands in ``metadata.system_prompt_digest``).
    """

    def __init__(self, host: PromptHost) -> None:
        self.host = host
        self.last_prompt: AssembledPrompt | None = None

    async def assemble_prompt(
        self,
        tools: Mapping[str, Any] | None = None,
        *,
        model: Any = None,
        variant: str | None = None,
    ) -> AssembledPrompt:
        """Assemble the prompt for ``tools`` (None: the agent's ``get_tools()``), naming
        ``model`` and ``variant`` in the environment section (None: the agent's
        ``get_model()``, and the model's own variant)."""
        ws = self.host.get_workspace()
        files = await find_project_instructions(ws, self.host.get_working_directory())
        if self.host.global_instructions.strip():
            files = [InstructionFile("(host)", self.host.global_instructions.strip()), *files]
        if model is None:
            try:
                model = self.host.get_model()
            except Exception:
                model = None
        if tools is None:
            tools = dict(await _maybe_await(self.host.get_tools()))
        prompt = assemble_system_prompt(
            manifest=await _maybe_await(self.host.get_manifest_prompt()),
            instructions=files,
            skills=await discover_skills(ws, self.host.skills_dir),
            environment=self.host.get_environment(model, variant),
            tools=tools,
        )
        self.last_prompt = prompt
        return prompt

    async def system_prompt_for(self, options: ChatOptions, tools: dict[str, Any]) -> str:
        """The turn hook: the assembled prompt for the turn's resolved tools, naming the
        turn's model and variant (a per-turn switch: ``options.model`` and
        ``options.model_selection``), kept in ``options.state`` for
        :meth:`message_metadata` (so the digest is of what this turn was sent)."""
        selection = options.model_selection or {}
        prompt = await self.assemble_prompt(
            tools, model=options.model, variant=selection.get("variant")
        )
        options.state[_STATE_KEY] = prompt
        return prompt.text

    def message_metadata(self, options: ChatOptions) -> dict[str, Any]:
        """The turn hook: ``{"system_prompt_digest": ...}`` when this turn's prompt was
        assembled here, else nothing."""
        prompt = options.state.get(_STATE_KEY)
        return {"system_prompt_digest": prompt.digest} if prompt is not None else {}


async def _maybe_await(value: Any) -> Any:
    if hasattr(value, "__await__"):
        return await value
    return value
