// The real `agents` npm client against thinkray's ingress (used by
// tests/test_ingress_agents_client.py). Run with `node --experimental-websocket` (Node 20
// has the browser's WebSocket behind that flag; `agents` uses the global one, as in a
// browser), from the folder where `agents` and `ai` are installed.
//
//   node --experimental-websocket client.mjs <scenario> <host:port> <agent name> <token>
//
// Only the packages' public API: `AgentClient` (agents/client) connects with a ticket in
// the query string (a browser's WebSocket cannot send headers; the ticket comes from an
// authenticated `POST .../ws-ticket`), `WebSocketChatTransport` (agents/chat) sends
// the chat request, cancels and resumes, with the wiring `useAgentChat` does for resume
// frames; `readUIMessageStream` (ai) folds the chunks into the message a UI shows;
// `agentFetch` reads `get-messages`. Scenarios:
//
// - chat: one turn; prints the identity, the chunk types, the message, the stored messages.
// - cancel: a long turn, cancelled after its first text delta (`cancelActiveServerTurn`);
//   waits for the server's `done`, prints the stored messages.
// - resume: a long turn read for a few chunks by one client, which closes; a second client
//   resumes it (`reconnectToStream`) and reads it to the end.
// - state: two clients with `onStateUpdate` / `onStateUpdateError` (an agent with synced
//   state): each `setState`s in turn and the other hears it; an invalid `setState` is
//   refused to its sender only; a change through HTTP (`PUT .../state`) reaches both.
//
// Prints one JSON object on stdout.
import { readFileSync } from 'node:fs';
import { AgentClient, agentFetch } from 'agents/client';
import { WebSocketChatTransport } from 'agents/chat/transport';
import { readUIMessageStream } from 'ai';

const [scenario, host, name, token] = process.argv.slice(2);
const AGENT = 'chat';
const version = (pkg) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url), 'utf8'))
    .version;

/** A short-lived ticket for this agent's socket, from an authenticated HTTP call: the
 * bearer token itself never goes into the socket's URL. */
async function ticket() {
  const response = await fetch(
    `http://${host}/agents/${AGENT}/${encodeURIComponent(name)}/ws-ticket`,
    { method: 'POST', headers: { authorization: `Bearer ${token}` } },
  );
  if (!response.ok) throw new Error(`ws-ticket answered ${response.status}`);
  return (await response.json()).ticket;
}

function connect(onFrame, options = {}) {
  const client = new AgentClient({
    host,
    agent: AGENT,
    name,
    // A function: PartySocket calls it on every (re)connect, so each gets a fresh ticket.
    query: async () => ({ ticket: await ticket() }),
    maxRetries: 0,
    ...options,
  });
  if (onFrame) {
    client.addEventListener('message', (event) => onFrame(JSON.parse(event.data)));
  }
  return client;
}

function userMessage(text, id) {
  return { id, role: 'user', parts: [{ type: 'text', text }] };
}

async function send(transport, text, id) {
  return transport.sendMessages({
    chatId: name,
    messages: [userMessage(text, id)],
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
  });
}

/** Fold a chunk stream into the message `useChat` would show; the chunk types seen. */
async function fold(stream, onChunk) {
  const types = [];
  const tapped = stream.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        types.push(chunk.type);
        onChunk?.(chunk);
        controller.enqueue(chunk);
      },
    }),
  );
  let message;
  const errors = [];
  try {
    for await (const m of readUIMessageStream({
      stream: tapped,
      onError: (e) => errors.push(String(e?.message ?? e)),
    })) {
      message = m;
    }
  } catch (e) {
    errors.push(String(e?.message ?? e));
  }
  return { types, message, errors };
}

async function stored() {
  const response = await agentFetch(
    { host, agent: AGENT, name, path: 'get-messages' },
    { headers: { authorization: `Bearer ${token}` } },
  );
  return { status: response.status, messages: response.ok ? await response.json() : null };
}

function waitFor(predicate, frames, what) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), 30000);
    const check = () => {
      const hit = frames.find(predicate);
      if (hit) {
        clearTimeout(timer);
        resolve(hit);
      } else {
        setTimeout(check, 10);
      }
    };
    check();
  });
}

async function chat() {
  const client = connect();
  await client.ready; // resolves on the server's cf_agent_identity
  const identity = { identified: client.identified, name: client.name, agent: client.agent };
  const transport = new WebSocketChatTransport({ agent: client });
  const out = await fold(await send(transport, 'hi', 'u1'));
  client.close();
  return { identity, ...out, stored: await stored() };
}

async function cancel() {
  const frames = [];
  const client = connect((f) => frames.push(f));
  await client.ready;
  const transport = new WebSocketChatTransport({ agent: client });
  let cancelled = false;
  const out = await fold(await send(transport, 'go', 'u1'), (chunk) => {
    if (chunk.type === 'text-delta' && !cancelled) {
      cancelled = transport.cancelActiveServerTurn();
    }
  });
  const requestId = frames.find((f) => f.type === 'cf_agent_use_chat_response')?.id;
  // The server ends the run: its last frames are `done`, then the stored messages.
  await waitFor((f) => f.type === 'cf_agent_use_chat_response' && f.done, frames, 'done');
  const done = frames.find((f) => f.type === 'cf_agent_use_chat_response' && f.done);
  const bodies = frames
    .filter((f) => f.type === 'cf_agent_use_chat_response' && f.body)
    .map((f) => JSON.parse(f.body).type);
  client.close();
  return { cancelled, requestId, done, serverChunkTypes: bodies, ...out, stored: await stored() };
}

async function resume() {
  const first = connect();
  await first.ready;
  const transport1 = new WebSocketChatTransport({ agent: first });
  const stream = await send(transport1, 'go', 'u1');
  const seen = [];
  const reader = stream.getReader();
  while (seen.filter((t) => t === 'text-delta').length < 3) {
    const { value, done } = await reader.read();
    if (done) break;
    seen.push(value.type);
  }
  first.close(); // the browser tab goes away mid-stream

  const frames = [];
  let transport2;
  // What useAgentChat does with the resume frames: hand them to the transport.
  const second = connect((f) => {
    frames.push(f);
    if (f.type === 'cf_agent_stream_resuming') transport2?.handleStreamResuming(f);
    if (f.type === 'cf_agent_stream_resume_none') transport2?.handleStreamResumeNone(f);
  });
  transport2 = new WebSocketChatTransport({ agent: second });
  await second.ready;
  const resumed = await transport2.reconnectToStream({ chatId: name });
  if (resumed === null) {
    second.close();
    return { seen, resumed: null, frames };
  }
  const out = await fold(resumed);
  const responses = frames.filter((f) => f.type === 'cf_agent_use_chat_response');
  second.close();
  return {
    seen,
    resumed: true,
    replayed: responses.filter((f) => f.replay === true && f.body).length,
    replayComplete: responses.filter((f) => f.replayComplete === true).length,
    ...out,
    stored: await stored(),
  };
}

/** A client that records what `onStateUpdate` and `onStateUpdateError` are given. */
function stateClient() {
  const seen = { updates: [], errors: [] };
  const client = connect(undefined, {
    onStateUpdate: (state, source) => seen.updates.push({ source, state }),
    onStateUpdateError: (error) => seen.errors.push(error),
  });
  return { client, seen };
}

function board(count, title = '') {
  return { count, title, items: [] };
}

async function state() {
  const a = stateClient();
  const b = stateClient();
  await Promise.all([a.client.ready, b.client.ready]); // ready once the state landed
  const initial = { a: a.client.state, b: b.client.state };
  const from = (seen, source, count) => (u) => u.source === source && u.state.count === count;

  a.client.setState(board(1, 'from a'));
  await waitFor(from(b.seen, 'server', 1), b.seen.updates, 'b hears a');
  b.client.setState(board(2, 'from b'));
  await waitFor(from(a.seen, 'server', 2), a.seen.updates, 'a hears b');

  a.client.setState({ count: 'many' }); // does not fit the agent's state model
  await waitFor(() => true, a.seen.errors, 'the error for a');
  b.client.setState(board(3, 'from b'));
  await waitFor(from(a.seen, 'server', 3), a.seen.updates, 'a hears b again');

  const put = await fetch(`http://${host}/agents/${AGENT}/${encodeURIComponent(name)}/state`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ state: board(10, 'from http') }),
  });
  await waitFor(from(a.seen, 'server', 10), a.seen.updates, 'a hears http');
  await waitFor(from(b.seen, 'server', 10), b.seen.updates, 'b hears http');
  const final = { a: a.client.state, b: b.client.state };
  a.client.close();
  b.client.close();
  const stored = await fetch(`http://${host}/agents/${AGENT}/${encodeURIComponent(name)}/state`, {
    headers: { authorization: `Bearer ${token}` },
  });
  return {
    initial,
    final,
    put: put.status,
    a: a.seen,
    b: b.seen,
    stored: await stored.json(),
  };
}

const scenarios = { chat, cancel, resume, state };
const result = await scenarios[scenario]();
process.stdout.write(
  JSON.stringify({ agents: version('agents'), ai: version('ai'), ...result }) + '\n',
);
process.exit(0);
