// An editor, as far as ACP goes: the official client (@agentclientprotocol/sdk) spawns
// `thinkray acp` and drives it over its stdio (tests/test_acp_client.py runs it).
//
//   node client.mjs <scenario> <command as JSON array> [sessionId]
//
// Scenarios (the agent is tests.acp_agents:AcpTestAgent):
//   first   initialize, session/new, a prompt with a tool call, a deploy approved once,
//           one denied, one whose permission request is answered "cancelled" (with
//           session/cancel, as ACP asks), and a slow answer cancelled mid-stream
//   load    session/load of sessionId in a new process (the replayed updates), a
//           prompt, session/close, then a prompt on the closed session (an error)
//   resume  session/resume of sessionId (no replay), a prompt, session/close
// Prints one JSON line with what it saw.

import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { client, methods, ndJsonStream, PROTOCOL_VERSION } from "@agentclientprotocol/sdk";

const [scenario, commandJson, knownSession] = process.argv.slice(2);
const [exe, ...args] = JSON.parse(commandJson);
const child = spawn(exe, args, { stdio: ["pipe", "pipe", "inherit"] });
const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
const stream = ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

const updates = []; // every session/update, in order
let answers = []; // what the next permission requests are answered, in order
const permissions = []; // the requests as received
let cancelAfter = null; // send session/cancel after this many agent text chunks
let textChunks = 0;

function brief(u) {
  const out = { update: u.sessionUpdate };
  if (u.content && u.content.type === "text") out.text = u.content.text;
  if (u.messageId) out.messageId = u.messageId;
  for (const k of ["toolCallId", "status", "title", "kind", "rawInput", "rawOutput"]) {
    if (u[k] !== undefined && u[k] !== null) out[k] = u[k];
  }
  if (Array.isArray(u.content)) {
    out.content = u.content.map((c) => (c.content && c.content.text) || "").join("");
  }
  return out;
}

const app = client({ name: "thinkray-test-editor" })
  .onNotification(methods.client.session.update, ({ params, agent }) => {
    updates.push({ sessionId: params.sessionId, ...brief(params.update) });
    if (params.update.sessionUpdate === "agent_message_chunk" && cancelAfter !== null) {
      textChunks += 1;
      if (textChunks === cancelAfter) {
        cancelAfter = null;
        agent.notify(methods.agent.session.cancel, { sessionId: params.sessionId });
      }
    }
  })
  .onRequest(methods.client.session.requestPermission, async ({ params, agent }) => {
    permissions.push({
      toolCallId: params.toolCall.toolCallId,
      title: params.toolCall.title,
      status: params.toolCall.status,
      rawInput: params.toolCall.rawInput,
      options: params.options.map((o) => [o.optionId, o.kind]),
    });
    const answer = answers.shift();
    if (answer === "cancelled") {
      // ACP: a client that cancels the turn answers its pending requests "cancelled".
      await agent.notify(methods.agent.session.cancel, { sessionId: params.sessionId });
      return { outcome: { outcome: "cancelled" } };
    }
    return { outcome: { outcome: "selected", optionId: answer } };
  });

async function prompt(ctx, sessionId, text) {
  const start = updates.length;
  const response = await ctx.request(methods.agent.session.prompt, {
    sessionId,
    prompt: [{ type: "text", text }],
  });
  return { stopReason: response.stopReason, updates: updates.slice(start) };
}

async function failure(op) {
  try {
    await op();
    return null;
  } catch (err) {
    return { code: err.code, message: err.message, data: err.data ?? null };
  }
}

const cwd = "/tmp/acp-project";

const result = await app.connectWith(stream, async (ctx) => {
  const init = await ctx.request(methods.agent.initialize, {
    protocolVersion: PROTOCOL_VERSION,
    clientCapabilities: {},
    clientInfo: { name: "thinkray-test-editor", version: "1.0.0" },
  });
  const out = { init };
  if (scenario === "first") {
    const created = await ctx.request(methods.agent.session.new, { cwd, mcpServers: [] });
    const sid = created.sessionId;
    out.sessionId = sid;
    out.weather = await prompt(ctx, sid, "weather Paris");
    answers = ["once"];
    out.approved = await prompt(ctx, sid, "deploy alpha");
    answers = ["deny"];
    out.denied = await prompt(ctx, sid, "deploy beta");
    answers = ["cancelled"];
    out.cancelledAsk = await prompt(ctx, sid, "deploy gamma");
    cancelAfter = 3;
    out.cancelled = await prompt(ctx, sid, "slow 400");
    out.permissions = permissions;
  } else if (scenario === "load") {
    const before = updates.length;
    out.loadResponse = await ctx.request(methods.agent.session.load, {
      sessionId: knownSession,
      cwd,
      mcpServers: [],
    });
    out.replayed = updates.slice(before);
    out.after = await prompt(ctx, knownSession, "hello again");
    out.closed = await ctx.request(methods.agent.session.close, { sessionId: knownSession });
    out.promptAfterClose = await failure(() => prompt(ctx, knownSession, "still there?"));
    out.loadUnknown = await failure(() =>
      ctx.request(methods.agent.session.load, { sessionId: "no-such-session", cwd, mcpServers: [] }),
    );
  } else if (scenario === "resume") {
    const before = updates.length;
    out.resumeResponse = await ctx.request(methods.agent.session.resume, {
      sessionId: knownSession,
      cwd,
    });
    out.replayed = updates.slice(before);
    out.after = await prompt(ctx, knownSession, "after resume");
    out.closed = await ctx.request(methods.agent.session.close, { sessionId: knownSession });
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  return out;
});

child.stdin.end(); // as an editor closing the agent: the server exits on end of input
result.exitCode = await exited;
const pkg = JSON.parse(
  await (await import("node:fs/promises")).readFile(
    new URL("./node_modules/@agentclientprotocol/sdk/package.json", import.meta.url),
  ),
);
result.sdkVersion = pkg.version;
console.log(JSON.stringify(result));
