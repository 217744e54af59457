"""Permission scopes (seed 002 "Permission scopes") and tool approvals.

Rules ``{tool, action, pin, match}`` live in three scopes:

=========  ===============================  ==========================================
scope      lifetime                         where
=========  ===============================  ==========================================
manifest   compile time, immutable          ``PermissionMixin.permission_rules``
session    this session only                ``sessions.permissions_json["rules"]``
project    every session of the project     a :class:`ProjectRules` (default: the
                                            actor's config table, key
                                            :data:`PROJECT_RULES_KEY`; a host may
                                            inject a shared one)
=========  ===============================  ==========================================

Evaluation (at tool-call time) flattens the layers into one ranked ruleset:

1. A matching manifest rule with ``pin=True`` always wins (the most specific pin; on a
   tie the most restrictive action, deny > ask > allow). Nothing overrides a pin.
2. Otherwise the most specific matching rule wins. Specificity, compared in order:
   an exact tool name beats a glob; more ``match`` conditions beat fewer (a rule that
   matches on the input beats one that does not); a glob with more literal characters
   beats a looser one (``fs_*`` beats ``*``).
3. Among equally specific rules: session > project > manifest, and within one scope
   the rule added last wins ("a more recent session allow").
4. Nothing matches: :attr:`PermissionMixin.permission_default` (``"allow"``).

``ask`` pauses the call until somebody answers through
:meth:`PermissionMixin.answer_approval` with ``"once"`` (allow this call),
``"session"`` (allow and add an allow rule to the session scope), ``"always"`` (allow
and add it to the project scope) or ``"deny"`` (the call ends as ``output-denied``).
The request goes out on the run's stream as the AI SDK chunk
``{"type": "tool-approval-request", "approvalId", "toolCallId"}`` and is listed by
:meth:`PermissionMixin.pending_approvals` until answered, timed out
(``approval_timeout``, the call is denied) or aborted (the run's abort finalizes the
call as an ``output-error`` "aborted: ..." — a clear state on reload).

Think hooks used: ``Think.check_tool_permission`` receives the turn's
:class:`~thinkray.runtime.agents.think.ChatOptions`; the request goes out with ``options.emit`` (the
same ordered stream as the model's chunks), and a human's "no" (or no answer in time)
is returned as ``ToolDenial(by_user=True)``, which the loop ends as
``tool-output-denied``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import inspect
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator
from thinkray.runtime.errors import AccessDeniedError, InvalidArgumentError, ToolCallStateError
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    ApprovalExpiredError as ApprovalExpiredError,
)
from thinkray.runtime.errors import (
    ApprovalNotFoundError as ApprovalNotFoundError,
)
from thinkray.runtime.messages import new_id
from thinkray.runtime.tools.base import ToolPolicy
from thinkray.runtime.tools.durable import policy_of
from thinkray.runtime.turn.loop import ToolDenial
from thinkray.runtime.typed_model import TypedModel
from thinkray.storage.records import ToolCallRecord

if TYPE_CHECKING:
    from thinkray.runtime.agents.runs import ChatOptions
    from thinkray.runtime.capabilities.host import PermissionHost

log = logging.getLogger("thinkray.permissions")

Action = Literal["allow", "deny", "ask"]
"""What a rule says: run the tool, refuse it, or pause and ask a human."""

Scope = Literal["manifest", "project", "session"]

ApprovalDecision = Literal["deny", "once", "session", "always"]
"""An answer to an ask: refuse; allow this call; allow for this session; allow always."""

ApprovalStatus = Literal["pending", "approved", "denied", "timed-out", "aborted"]

PROJECT_RULES_KEY = "think.permissions.project"
"""Reserved config key under which :class:`StoreProjectRules` keeps the project scope."""

_SCOPE_RANK: dict[str, int] = {"manifest": 0, "project": 1, "session": 2}
_RESTRICTIVENESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}
_GLOB_CHARS = frozenset("*?[")


class PermissionRule(TypedModel):
    """One rule. ``tool`` is an exact tool name or a glob (``*``, ``?``, ``[..]``);
    ``match`` maps input fields (dotted paths into the tool input) to globs on the
    field's value (non-strings are compared as compact JSON); every condition must
    hold. ``pin`` is meaningful in the manifest scope only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str = Field(min_length=1)
    action: Action
    pin: bool = False
    match: dict[str, str] | None = None

    @field_validator("match")
    @classmethod
    def _non_empty(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return value or None

    @property
    def is_glob(self) -> bool:
        """True if the rule's tool or match pattern is a glob."""
        return any(c in _GLOB_CHARS for c in self.tool)

    def specificity(self) -> tuple[int, int, int]:
        """How specific the rule is (more specific rules win)."""
        literal = sum(1 for c in self.tool if c not in _GLOB_CHARS)
        return (0 if self.is_glob else 1, len(self.match or ()), literal)

    def matches(self, tool_name: str, input: Any) -> bool:
        """True if the rule applies to a call of ``tool_name`` with ``input``."""
        if self.is_glob:
            if not fnmatch.fnmatchcase(tool_name, self.tool):
                return False
        elif tool_name != self.tool:
            return False
        if not self.match:
            return True
        data = _plain(input)
        for path, pattern in self.match.items():
            found, value = _lookup(data, path)
            if not found or not fnmatch.fnmatchcase(_as_text(value), pattern):
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        """The rule as a JSON-ready dict."""
        return self.model_dump(exclude_defaults=True) | {"action": self.action}


RuleLike = PermissionRule | dict[str, Any]


def as_rule(rule: RuleLike) -> PermissionRule:
    """A :class:`PermissionRule` from a rule or a dict; raises on an invalid rule."""
    return rule if isinstance(rule, PermissionRule) else PermissionRule.model_validate(rule)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _lookup(data: Any, path: str) -> tuple[bool, Any]:
    for key in path.split("."):
        if isinstance(data, dict) and key in data:
            data = data[key]
        elif isinstance(data, list) and key.isdigit() and int(key) < len(data):
            data = data[int(key)]
        else:
            return False, None
    return True, data


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


@dataclass(frozen=True)
class PermissionDecision:
    """The outcome of :func:`evaluate`: the action, and the rule and scope that gave it
    (both ``None`` when the default applied)."""

    action: Action
    rule: PermissionRule | None = None
    scope: Scope | None = None

    def describe(self) -> str:
        """Which rule (scope, tool, pin) decided, for messages."""
        if self.rule is None:
            return "the default policy"
        pin = "pinned " if self.rule.pin and self.scope == "manifest" else ""
        match = f" with match {self.rule.match}" if self.rule.match else ""
        return f"the {pin}{self.scope} rule {self.rule.action} {self.rule.tool!r}{match}"


def evaluate(
    tool_name: str,
    input: Any,
    *,
    manifest: Iterable[RuleLike] = (),
    project: Iterable[RuleLike] = (),
    session: Iterable[RuleLike] = (),
    default: Action = "allow",
) -> PermissionDecision:
    """The ranked evaluation described in the module docstring (pure function)."""
    pins: list[tuple[tuple[int, ...], PermissionRule]] = []
    ranked: list[tuple[tuple[int, ...], PermissionRule, Scope]] = []
    layers: tuple[tuple[Scope, Iterable[RuleLike]], ...] = (
        ("manifest", manifest),
        ("project", project),
        ("session", session),
    )
    for scope, rules in layers:
        for order, raw in enumerate(rules):
            rule = as_rule(raw)
            if not rule.matches(tool_name, input):
                continue
            if scope == "manifest" and rule.pin:
                pins.append(((*rule.specificity(), _RESTRICTIVENESS[rule.action]), rule))
            else:
                ranked.append(((*rule.specificity(), _SCOPE_RANK[scope], order), rule, scope))
    if pins:
        pin = max(pins, key=lambda p: p[0])[1]
        return PermissionDecision(pin.action, pin, "manifest")
    if ranked:
        _, rule, scope = max(ranked, key=lambda r: r[0])
        return PermissionDecision(rule.action, rule, scope)
    return PermissionDecision(default)


# -- the project scope ----------------------------------------------------------------


@runtime_checkable
class ProjectRules(Protocol):
    """The project scope's storage (the host's choice). ``rules`` is oldest first;
    ``add`` is idempotent (an identical rule already present is not added again, and
    re-adding moves nothing)."""

    def rules(self) -> list[PermissionRule]:
        """Every project rule, oldest first."""
        ...

    def add(self, rule: RuleLike) -> None:
        """Add a rule (a no-op if present)."""
        ...

    def remove(self, rule: RuleLike) -> bool:
        """Remove a rule; False if absent."""
        ...


class MemoryProjectRules:
    """Project rules held in memory (tests, or a host that persists them itself)."""

    def __init__(self, rules: Iterable[RuleLike] = ()) -> None:
        self._rules = [_scoped(as_rule(r), "project") for r in rules]

    def rules(self) -> list[PermissionRule]:
        """Every project rule, oldest first."""
        return list(self._rules)

    def add(self, rule: RuleLike) -> None:
        """Add a rule (a no-op if present)."""
        rule = _scoped(as_rule(rule), "project")
        if rule not in self._rules:
            self._rules.append(rule)

    def remove(self, rule: RuleLike) -> bool:
        """Remove a rule; False if absent."""
        rule = as_rule(rule)
        if rule in self._rules:
            self._rules.remove(rule)
            return True
        return False


class StoreProjectRules:
    """Project rules in the actor's config table (``store.get_config/set_config``
    under :data:`PROJECT_RULES_KEY`): they outlive every session of this store."""

    def __init__(self, store: Any, key: str = PROJECT_RULES_KEY) -> None:
        self.store = store
        self.key = key

    def rules(self) -> list[PermissionRule]:
        """Every project rule, oldest first (read from the store's config)."""
        raw = self.store.get_config(self.key) or []
        return [as_rule(r) for r in raw]

    def _save(self, rules: list[PermissionRule]) -> None:
        self.store.set_config(self.key, [r.to_dict() for r in rules])

    def add(self, rule: RuleLike) -> None:
        """Add a rule (a no-op if present); persisted."""
        rule = _scoped(as_rule(rule), "project")
        rules = self.rules()
        if rule not in rules:
            self._save([*rules, rule])

    def remove(self, rule: RuleLike) -> bool:
        """Remove a rule; False if absent; persisted."""
        rule = as_rule(rule)
        rules = self.rules()
        if rule not in rules:
            return False
        rules.remove(rule)
        self._save(rules)
        return True


def _scoped(rule: PermissionRule, scope: Scope) -> PermissionRule:
    if rule.pin and scope != "manifest":
        raise InvalidArgumentError(
            f"pin is only meaningful in the manifest scope, not the {scope} scope"
        )
    return rule


# -- approvals --------------------------------------------------------------------------


@dataclass
class Approval:
    """One ``ask``: visible through :meth:`PermissionMixin.pending_approvals`."""

    approval_id: str
    session_id: str
    run_id: str | None
    tool_call_id: str
    tool_name: str
    input: Any
    requested_at: float
    expires_at: float | None
    status: ApprovalStatus = "pending"
    decision: ApprovalDecision | None = None
    answered_by: str | None = None
    future: asyncio.Future[str] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The approval as a JSON-ready dict (no future)."""
        return {
            "approval_id": self.approval_id,
            "session_id": self.session_id,
            "run_id": self.run_id,
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
            "input": _plain(self.input),
            "requested_at": self.requested_at,
            "expires_at": self.expires_at,
            "status": self.status,
            "decision": self.decision,
            "answered_by": self.answered_by,
        }


# -- the mixin --------------------------------------------------------------------------


class Permissions:
    """Permission scopes and approvals, attached to an agent by composition
    (``agent.permissions``; :class:`~thinkray.runtime.agents.agent.Agent` builds one).
    Works against :class:`~thinkray.runtime.capabilities.host.PermissionHost`: the
    agent's store and sessions, plus its ``permission_rules`` (the manifest scope),
    ``permission_default`` (the action when no rule matches), ``approval_timeout``
    (seconds an ask waits before the call is denied; None: no limit) and
    ``approval_history_size``.

    - ``evaluate_permission(tool_name, input, session_id=None)`` → :class:`PermissionDecision`.
    - ``session_rules / add_session_rule / remove_session_rule`` (session scope).
    - ``project_rules`` (a :class:`ProjectRules`; assign to inject the host's),
      ``add_project_rule / remove_project_rule``.
    - ``pending_approvals(session_id=None)``, ``get_approval(approval_id)``,
      ``answer_approval(approval_id, decision, answered_by=None)``.
    - ``await check_tool_permission(...)``: the turn hook (asks go out through
      ``options.emit``).
    """

    def __init__(self, host: PermissionHost) -> None:
        self.host = host
        self._project_rules: ProjectRules | None = None
        self._approvals: OrderedDict[str, Approval] = OrderedDict()

    def manifest_rules(self) -> tuple[PermissionRule, ...]:
        """The manifest scope, validated."""
        return tuple(as_rule(r) for r in self.host.permission_rules)

    @property
    def project_rules(self) -> ProjectRules:
        """The project scope (default: rules kept in the agent's store)."""
        if self._project_rules is None:
            self._project_rules = StoreProjectRules(self.host.store)
        return self._project_rules

    @project_rules.setter
    def project_rules(self, value: ProjectRules) -> None:
        self._project_rules = value

    def add_project_rule(self, rule: RuleLike) -> PermissionRule:
        """Add a rule to the project scope; returns it, scoped."""
        rule = _scoped(as_rule(rule), "project")
        self.project_rules.add(rule)
        return rule

    def remove_project_rule(self, rule: RuleLike) -> bool:
        """Remove a rule from the project scope; False if absent."""
        return self.project_rules.remove(rule)

    def session_rules(self, session_id: str | None = None) -> list[PermissionRule]:
        """The session scope's rules (default: the current session)."""
        sid = self.host.sessions.resolve(session_id)
        info = self.host.store.get_session(sid)
        return [as_rule(r) for r in (info.permissions or {}).get("rules", ())]

    def _save_session_rules(self, sid: str, rules: list[PermissionRule]) -> None:
        info = self.host.store.get_session(sid)
        permissions = dict(info.permissions or {})
        permissions["rules"] = [r.to_dict() for r in rules]
        self.host.store.update_session(sid, permissions=permissions)

    def add_session_rule(self, rule: RuleLike, session_id: str | None = None) -> PermissionRule:
        """Add (or move to newest) a rule in the session scope."""
        sid = self.host.sessions.resolve(session_id)
        rule = _scoped(as_rule(rule), "session")
        rules = [r for r in self.session_rules(sid) if r != rule]
        self._save_session_rules(sid, [*rules, rule])
        return rule

    def remove_session_rule(self, rule: RuleLike, session_id: str | None = None) -> bool:
        """Remove a rule from the session scope; False if absent."""
        sid = self.host.sessions.resolve(session_id)
        rule = as_rule(rule)
        rules = self.session_rules(sid)
        if rule not in rules:
            return False
        rules.remove(rule)
        self._save_session_rules(sid, rules)
        return True

    def evaluate_permission(
        self, tool_name: str, input: Any = None, session_id: str | None = None
    ) -> PermissionDecision:
        """The verdict for a call: manifest pins first, then the most specific rule."""
        sid = session_id or self.host.current_session_id
        session = self.session_rules(sid) if sid else []
        return evaluate(
            tool_name,
            input,
            manifest=self.manifest_rules(),
            project=self.project_rules.rules(),
            session=session,
            default=self.host.permission_default,
        )

    # -- approvals ------------------------------------------------------------------

    def pending_approvals(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Asks waiting for an answer, oldest first (JSON-ready dicts). Read from the
        agent's database: they survive a restart and any process may list them."""
        rows = self.host.tool_calls.store.rows("awaiting-approval")
        return [
            _approval_of(rec)
            for rec in rows
            if rec.approval and (session_id is None or rec.session_id == session_id)
        ]

    def get_approval(self, approval_id: str) -> dict[str, Any] | None:
        """An approval, pending or settled (from the database)."""
        rec = self._record_of(approval_id)
        return _approval_of(rec) if rec is not None else None

    def _record_of(self, approval_id: str) -> ToolCallRecord | None:
        approval = self._approvals.get(approval_id)
        store = self.host.tool_calls.store
        if approval is not None:
            rec = store.get(self.host.tool_calls.record_id(approval.tool_call_id, approval.run_id))
            if rec is not None:
                return rec
        # The asks still waiting first (few rows): only a settled ask needs them all.
        for rows in (store.rows("awaiting-approval"), store.rows()):
            for rec in rows:
                if rec.approval and rec.approval.get("approval_id") == approval_id:
                    return rec
        return None

    def answer_approval(
        self, approval_id: str, decision: ApprovalDecision, answered_by: str | None = None
    ) -> dict[str, Any]:
        """Answer an ask. ``session``/``always`` add ``{tool: <this tool's name>,
        action: allow}`` to the session / project scope first (so a storage error
        reaches the answerer and the call stays pending), then release the call; other
        pending asks that the new rule now allows are released too. A manifest pin
        still wins over the new rule on later calls."""
        if decision not in ("deny", "once", "session", "always"):
            raise InvalidArgumentError(
                f"decision must be deny, once, session or always, not {decision!r}"
            )
        if answered_by is not None and not isinstance(answered_by, str):
            raise InvalidArgumentError("answered_by must be a string or None")
        rec = self._record_of(approval_id)
        if rec is None or rec.status != "awaiting-approval":
            if rec is not None and rec.status == "cancelled-by-timeout":
                raise ApprovalExpiredError(f"approval {approval_id!r} expired unanswered")
            raise ApprovalNotFoundError(f"no pending approval {approval_id!r}")
        pending = _approval_of(rec)
        if not self.host.may_approve(pending, answered_by):
            raise AccessDeniedError(
                f"{answered_by or 'an anonymous caller'} may not answer approval {approval_id!r}"
            )
        self._refuse_if_expired(rec, approval_id)
        rule = PermissionRule(tool=rec.tool_name, action="allow")
        if decision == "session":
            self.add_session_rule(rule, rec.session_id)
        elif decision == "always":
            self.add_project_rule(rule)
        settled = self._settle(rec, decision, answered_by)
        if decision in ("session", "always"):
            for other in self.host.tool_calls.store.rows("awaiting-approval"):
                if other.id == rec.id or not other.approval:
                    continue
                if decision == "session" and other.session_id != rec.session_id:
                    continue
                verdict = self.evaluate_permission(other.tool_name, other.input, other.session_id)
                if verdict.action == "allow":
                    self._settle(other, "once", answered_by)
        return settled

    def _refuse_if_expired(self, rec: ToolCallRecord, approval_id: str) -> None:
        """An ask past its ``expires_at`` is over whatever happened to the process (the
        coroutine that timed it may have died with it): it ends ``cancelled-by-timeout``
        now and the answer is refused."""
        expires = (rec.approval or {}).get("expires_at")
        if not isinstance(expires, (int, float)) or time.time() < expires:
            return
        # ApprovalNotFoundError: the alarm or the waiting turn ended it first.
        with contextlib.suppress(ApprovalNotFoundError):
            self._settle(rec, "timeout", None, "expired unanswered")
        raise ApprovalExpiredError(
            f"approval {approval_id!r} expired at {expires:.3f} (epoch seconds); "
            "the call is cancelled-by-timeout and the answer is refused"
        )

    def _settle(
        self,
        rec: ToolCallRecord,
        decision: ApprovalDecision | Literal["timeout", "cancelled"],
        by: str | None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Record a decision on an ask: the audit row and the call's move
        (``awaiting-approval`` → ``pending`` to run, ``denied``, or cancelled by timeout
        or by the user), in one transaction; then release the turn waiting for it."""
        store = self.host.tool_calls.store
        approved = decision in ("once", "session", "always")
        status = {
            "deny": "denied",
            "timeout": "cancelled-by-timeout",
            "cancelled": "cancelled-by-user",
        }.get(decision, "pending")
        verdict = "approved" if approved else {"deny": "denied"}.get(decision, decision)
        now = time.time()
        approval = {
            **(rec.approval or {}),
            "decision": decision,
            "answered_by": by,
            "answered_at": now,
        }
        with store.transaction():
            moved = store.transition(
                rec.id,
                ["awaiting-approval"],
                status,
                approval=approval,
                error=None if approved else (reason or f"approval {verdict}"),
            )
            if moved is None:
                raise ApprovalNotFoundError(f"approval of call {rec.id!r} was settled meanwhile")
            if approved:
                # The ask's expiry no longer applies; the call's own deadline does.
                ledger = self.host.tool_calls
                deadline = ledger.deadline_for(rec.tool_name, now) if rec.durable else None
                moved = store.set_deadline(rec.id, deadline, expect=["pending"]) or moved
            store.audit(rec.id, verdict, by=by, reason=reason or str(decision))
        live = self._approvals.get(str(approval.get("approval_id")))
        waiting = live is not None and live.future is not None and not live.future.done()
        if live is not None and decision in ("deny", "once", "session", "always"):
            live.status = "approved" if approved else "denied"
            live.decision = decision
            live.answered_by = by
            if live.future is not None and not live.future.done():
                live.future.set_result(decision)  # the turn waiting for it goes on
        if approved and moved.deadline_at is not None:
            self.host.tool_calls.arm_at(moved.deadline_at)
        if not waiting and decision in ("deny", "once", "session", "always", "timeout"):
            # No turn waits for it (its run was cut off by a crash): the agent decides
            # whether to finish the run (generation recovery).
            settled = getattr(self.host, "on_tool_call_settled", None)
            if callable(settled):
                settled(moved)
        return _approval_of(moved)

    def _remember(self, approval: Approval) -> None:
        records = self._approvals
        records[approval.approval_id] = approval
        while len(records) > self.host.approval_history_size:
            oldest = next(iter(records))
            if records[oldest].status == "pending":
                break
            records.popitem(last=False)

    async def _ask(
        self, options: Any, tool_name: str, input: Any, call_id: str
    ) -> ApprovalDecision | None:
        """Emit the request on the turn's stream and wait. Returns the decision, or
        None on timeout."""
        now = time.time()
        timeout = self.host.approval_timeout
        approval = Approval(
            approval_id=new_id("apr"),
            session_id=options.session_id,
            run_id=options.run_id,
            tool_call_id=call_id,
            tool_name=tool_name,
            input=input,
            requested_at=now,
            expires_at=now + timeout if timeout is not None else None,
            future=asyncio.get_running_loop().create_future(),
        )
        self._remember(approval)
        policy = await self._policy_of(options, tool_name)
        rec = self._store_ask(approval, durable=policy is not None and policy.decoupled)
        aborted = asyncio.ensure_future(options.signal.wait())
        try:
            await options.emit(
                {
                    "type": "tool-approval-request",
                    "approvalId": approval.approval_id,
                    "toolCallId": call_id,
                }
            )
            assert approval.future is not None
            done, _ = await asyncio.wait(
                {approval.future, aborted}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if approval.future in done:
                return approval.future.result()  # type: ignore[return-value]
            outcome: Literal["cancelled", "timeout"] = "cancelled" if aborted in done else "timeout"
            reason = (
                f"aborted: {options.signal.reason}"
                if outcome == "cancelled"
                else f"no answer within {timeout:g}s"
            )
            try:
                self._settle(rec, outcome, None, reason)
            except ApprovalNotFoundError:  # answered in the same instant: the answer holds
                if approval.future.done():
                    return approval.future.result()  # type: ignore[return-value]
            approval.status = "aborted" if outcome == "cancelled" else "timed-out"
            return "deny" if outcome == "cancelled" else None
        except asyncio.CancelledError:
            if approval.status == "pending":
                approval.status = "aborted"
            raise
        finally:
            aborted.cancel()
            if approval.status == "pending":
                approval.status = "aborted"

    async def _policy_of(self, options: Any, tool_name: str) -> ToolPolicy | None:
        """The policy of the tool a turn asks about: a tool of the turn's own, else of
        the agent's ``get_tools``; None if neither has it."""
        tool = (getattr(options, "tools", None) or {}).get(tool_name)
        get_tools = getattr(self.host, "get_tools", None)
        if tool is None and callable(get_tools):
            try:
                tools = get_tools()
                if inspect.isawaitable(tools):
                    tools = await tools
                tool = dict(tools).get(tool_name)
            except Exception:  # the ask still goes out; the call is taken as inline
                log.exception("could not read the tools to ask about %s", tool_name)
        return policy_of(tool) if tool is not None else None

    def _store_ask(self, approval: Approval, *, durable: bool = False) -> ToolCallRecord:
        """The ask as its tool call's row, ``awaiting-approval`` (written before the
        request goes out: any process can list and answer it, and it survives a
        restart), with the ask's expiry as the row's deadline and the agent's alarm
        armed for it: an ask past ``expires_at`` ends ``cancelled-by-timeout`` even if
        this process dies. ``durable``: the tool runs on a decoupled executor."""
        ledger = self.host.tool_calls
        store = ledger.store
        if approval.expires_at is not None:
            ledger.arm_at(approval.expires_at)
        info = {
            "approval_id": approval.approval_id,
            "requested_at": approval.requested_at,
            "expires_at": approval.expires_at,
        }
        call_id = self.host.tool_calls.record_id(approval.tool_call_id, approval.run_id)
        rec = store.get(call_id)
        if rec is None:
            return store.insert(
                ToolCallRecord(
                    id=call_id,
                    tool_name=approval.tool_name,
                    status="awaiting-approval",
                    run_id=approval.run_id,
                    session_id=approval.session_id,
                    input=_plain(approval.input),
                    approval=info,
                    durable=durable,
                    deadline_at=approval.expires_at,
                )
            )
        with store.transaction():
            moved = store.transition(rec.id, ["pending"], "awaiting-approval", approval=info)
            if moved is None:
                raise ToolCallStateError(
                    f"tool call {rec.id!r} is {rec.status}; it cannot ask again"
                )
            return store.set_deadline(rec.id, approval.expires_at) or moved

    # -- Think hooks ----------------------------------------------------------------

    async def check_tool_permission(
        self, tool_name: str, input: Any, call_id: str, options: ChatOptions | None = None
    ) -> str | ToolDenial | None:
        """The turn hook: None allows the call; a reason or a ToolDenial refuses it.
        An ``ask`` goes out on the turn's stream and waits for ``answer_approval``."""
        sid = options.session_id if options else self.host.current_session_id
        verdict = self.evaluate_permission(tool_name, input, sid)
        if verdict.action == "deny":
            return f"permission denied: {tool_name!r} is denied by {verdict.describe()}"
        if verdict.action == "ask":
            if options is None:
                return (
                    f"permission denied: {tool_name!r} needs approval ({verdict.describe()}) "
                    "but this call has no run to ask through"
                )
            decision = await self._ask(options, tool_name, input, call_id)
            if decision is None:  # nobody answered: the AI SDK's denied state
                return ToolDenial(
                    f"permission denied: the approval for {tool_name!r} timed out after "
                    f"{self.host.approval_timeout:g}s",
                    by_user=True,
                )
            if decision == "deny":
                return ToolDenial(
                    f"permission denied: the user denied this {tool_name!r} call", by_user=True
                )
        return None


def _approval_of(rec: ToolCallRecord) -> dict[str, Any]:
    """An ask, from its tool call's row, in the shape ``pending_approvals`` lists."""
    info = rec.approval or {}
    decision = info.get("decision")
    status = {
        "awaiting-approval": "pending",
        "denied": "denied",
        "cancelled-by-timeout": "timed-out",
        "cancelled-by-user": "aborted",
    }.get(rec.status, "approved" if decision in ("once", "session", "always") else rec.status)
    return {
        "approval_id": info.get("approval_id"),
        "session_id": rec.session_id,
        "run_id": rec.run_id,
        "tool_call_id": rec.id,
        "tool_name": rec.tool_name,
        "input": rec.input,
        "requested_at": info.get("requested_at"),
        "expires_at": info.get("expires_at"),
        "status": status,
        "decision": decision if decision in ("deny", "once", "session", "always") else None,
        "answered_by": info.get("answered_by"),
        "call_status": rec.status,
    }
