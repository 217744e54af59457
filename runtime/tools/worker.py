"""The built-in external executor for durable tool calls (seed 003 §1.2).

A :class:`ToolCallWorker` claims the pending calls of its tools from one agent, runs
each, and reports the outcome; while a tool runs it renews the call's claim (a
heartbeat at a third of the lease), so the claim lapses only when the worker stops
beating: it died, hung, or lost its connection. A worker that learns it lost a claim
(:class:`~thinkray.runtime.errors.ClaimLostError` from a renewal) aborts the tool (its
``ctx.signal`` fires) and reports nothing: another executor has the call.

The agent is anything with the remote surface ``claim_tool_calls``,
``renew_tool_call`` and ``submit_tool_result``: an agent handle (from another
process, ``AgentNamespace.connect(...).get(name)``) or a
:class:`~thinkray.runtime.agents.think.Think` in the same event loop::

    worker = ToolCallWorker(ns.get("alice"), [render])
    await worker.run(stop.signal)  # until stop.abort()
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from thinkray.runtime.abort import AbortController, AbortError, AbortSignal
from thinkray.runtime.errors import ClaimLostError, InvalidArgumentError, UnknownToolCallError
from thinkray.runtime.tools.base import Tool, ToolContext, run_tool

__all__ = ["ToolCallWorker"]

log = logging.getLogger("thinkray.tools.worker")

MIN_BEAT = 0.05  # seconds: the shortest heartbeat interval, whatever the lease


class ToolCallWorker:
    """Claims, runs and reports the external calls of ``tools`` on ``agent``.

    ``name`` is the executor name the agent records (unique per worker by default:
    two workers never share one, so a restarted worker cannot report for its dead
    predecessor). ``lease``: seconds each claim holds between heartbeats (None: the
    tool policy's). ``concurrency``: calls run at once."""

    def __init__(
        self,
        agent: Any,
        tools: Iterable[Tool] | Mapping[str, Tool],
        *,
        name: str | None = None,
        lease: float | None = None,
        concurrency: int = 1,
    ) -> None:
        self.agent = agent
        self.tools: dict[str, Tool] = (
            dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
        )
        if not self.tools:
            raise InvalidArgumentError("a ToolCallWorker needs at least one tool")
        if concurrency < 1:
            raise InvalidArgumentError("concurrency must be >= 1")
        self.name = name or f"worker-{uuid.uuid4().hex[:12]}"
        self.lease = lease
        self.concurrency = concurrency
        self.outcomes: dict[str, str] = {}  # call id -> accepted | discarded-late | lost ...

    async def _call(self, method: str, *args: Any) -> Any:
        """Call ``method`` on the agent: through a handle's ``.remote`` or directly."""
        bound = getattr(self.agent, method)
        remote = getattr(bound, "remote", None)
        out = remote(*args) if callable(remote) else bound(*args)
        return await out if inspect.isawaitable(out) else out

    async def run_once(self, wait: float = 0.0) -> list[str]:
        """Claim up to ``concurrency`` calls (waiting up to ``wait`` s for one), run
        them to the end and return their ids."""
        calls = await self._call(
            "claim_tool_calls", sorted(self.tools), self.name, self.concurrency, wait, self.lease
        )
        await asyncio.gather(*(self.execute(call) for call in calls))
        return [call["tool_call_id"] for call in calls]

    async def run(self, signal: AbortSignal | None = None, *, wait: float = 10.0) -> None:
        """Claim and run calls until ``signal`` fires (a call running then is aborted
        and not reported: its claim lapses and another executor takes it)."""
        while signal is None or not signal.aborted:
            work = asyncio.ensure_future(self.run_once(wait))
            if signal is None:
                await work
                continue
            stop = asyncio.ensure_future(signal.wait())
            try:
                await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                return
            work.result()

    async def execute(self, call: dict[str, Any]) -> str:
        """Run one claimed call (a dict as ``claim_tool_calls`` returns them) with a
        heartbeat, and report it. Returns what the agent said (``accepted``, or
        ``discarded-late`` / ``stored-late`` for a call cancelled meanwhile) or
        ``lost`` (the claim lapsed or was taken: nothing reported)."""
        call_id = call["tool_call_id"]
        controller = AbortController()
        beat = asyncio.ensure_future(self._heartbeat(call, controller))
        output: Any = None
        error: str | None = None
        try:
            t = self.tools[call["tool_name"]]
            ctx = ToolContext(
                tool_call_id=call_id,
                tool_name=t.name,
                signal=controller.signal,
                session_id=call.get("session_id"),
                run_id=call.get("run_id"),
                extras={"attempts": call.get("attempts", 1), "executor": self.name},
            )
            output = await run_tool(t, t.validate(call.get("input")), ctx)
        except AbortError:
            return self._note(call_id, "lost")
        except Exception as exc:  # the tool's failure is the call's outcome
            error = f"{type(exc).__name__}: {exc}"
        finally:
            beat.cancel()
        if controller.signal.aborted:
            return self._note(call_id, "lost")
        try:
            said = await self._call("submit_tool_result", call_id, self.name, output, error)
        except (ClaimLostError, UnknownToolCallError) as exc:
            log.warning("%s: result for %s refused: %s", self.name, call_id, exc)
            return self._note(call_id, "lost")
        return self._note(call_id, str(said))

    def _note(self, call_id: str, outcome: str) -> str:
        self.outcomes[call_id] = outcome
        return outcome

    async def _heartbeat(self, call: dict[str, Any], controller: AbortController) -> None:
        """Renew the claim at a third of its lease until cancelled; abort the tool when
        the claim is lost. The lease is read off the agent's own clock (``lease_until -
        updated_at``), so a skewed clock here changes nothing."""
        call_id = call["tool_call_id"]
        current = call
        while True:
            lease_until, stamped = current.get("lease_until"), current.get("updated_at")
            if lease_until is None or stamped is None:
                return  # no lease: nothing lapses
            await asyncio.sleep(max(MIN_BEAT, (float(lease_until) - float(stamped)) / 3))
            try:
                current = await self._call("renew_tool_call", call_id, self.name, self.lease)
            except (ClaimLostError, UnknownToolCallError) as exc:
                controller.abort(f"claim lost: {exc}")
                return
            except Exception as exc:  # a blip (the agent waking): beat again soon
                log.warning("%s: renewing %s failed: %s", self.name, call_id, exc)
