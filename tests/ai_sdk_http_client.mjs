// A real AI SDK client talking HTTP to a live thinkray ingress (used by
// tests/test_ingress_ai_sdk.py).
//
// Reads one JSON request from stdin: {op, api, token, chatId, text?}. `api` is the chat
// URL (`${base}/agents/<class>/<name>/chat`); the bearer token goes in the transport's
// `headers`. Only the installed `ai` package's public API is used:
//
// - op "chat": a `Chat` (the package's `AbstractChat`, what `useChat` wraps) over
//   `DefaultChatTransport` sends a user message; the transport POSTs it and parses the
//   live SSE stream, the chat folds it into its messages. Prints the chat's messages,
//   status and errors.
// - op "read": `DefaultChatTransport.sendMessages` and `readUIMessageStream` over its
//   chunks, to the end. Prints the last message snapshot and errors.
// - op "resume": `DefaultChatTransport.reconnectToStream` (GET `${api}/${chatId}/stream`)
//   and `readUIMessageStream` over what it returns (null when nothing runs: 204).
//
// This file is copied next to each installed `ai` (so that `import 'ai'` resolves to
// that version).
import { readFileSync } from 'node:fs';
import { AbstractChat, DefaultChatTransport, readUIMessageStream } from 'ai';

const request = JSON.parse(readFileSync(0, 'utf8'));
const version = JSON.parse(
  readFileSync(new URL('./node_modules/ai/package.json', import.meta.url), 'utf8'),
).version;

const transport = new DefaultChatTransport({
  api: request.api,
  headers: { authorization: `Bearer ${request.token}` },
});

class State {
  constructor() {
    this.status = 'ready';
    this.error = undefined;
    this.messages = [];
  }
  pushMessage(message) {
    this.messages = this.messages.concat(structuredClone(message));
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [
      ...this.messages.slice(0, index),
      structuredClone(message),
      ...this.messages.slice(index + 1),
    ];
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class Chat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new State() });
  }
}

function errorText(error) {
  return error instanceof Error ? error.message : String(error);
}

async function readAll(stream) {
  const errors = [];
  let last = null;
  let snapshots = 0;
  for await (const snapshot of readUIMessageStream({
    stream,
    onError: error => errors.push(errorText(error)),
  })) {
    last = snapshot;
    snapshots += 1;
  }
  return { errors, message: last, snapshots };
}

async function chat() {
  const errors = [];
  let finish = null;
  const chat = new Chat({
    id: request.chatId,
    transport,
    onError: error => errors.push(errorText(error)),
    onFinish: ({ isAbort, isError, isDisconnect, finishReason }) => {
      finish = { isAbort, isError, isDisconnect, finishReason };
    },
  });
  await chat.sendMessage({ text: request.text });
  return {
    status: chat.status,
    error: chat.error ? errorText(chat.error) : null,
    errors,
    finish,
    messages: chat.messages,
  };
}

async function read() {
  const stream = await transport.sendMessages({
    chatId: request.chatId,
    messages: [{ id: request.messageId, role: 'user', parts: [{ type: 'text', text: request.text }] }],
    abortSignal: undefined,
    trigger: 'submit-message',
    messageId: undefined,
  });
  return readAll(stream);
}

async function resume() {
  const stream = await transport.reconnectToStream({ chatId: request.chatId });
  if (stream === null) {
    return { stream: null };
  }
  return { stream: true, ...(await readAll(stream)) };
}

const ops = { chat, read, resume };
const out = { version, result: await ops[request.op]() };
process.stdout.write(JSON.stringify(out));
