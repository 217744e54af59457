// A real AI SDK client for one thinkray stream (used by tests/test_ai_sdk_clients.py).
//
// Reads one UI message stream from stdin, as it goes over HTTP (thinkray's `to_sse`
// frames, `data: <json>\n\n` ... `data: [DONE]\n\n`), and hands it to the installed `ai`
// package twice, through its public API only:
//
// - `chat`: a `Chat` (the package's `AbstractChat`, what `useChat` wraps) sends a user
//   message over `DefaultChatTransport`, whose `fetch` answers with that body. The
//   transport parses the SSE with the package's own chunk schema; the chat folds the
//   chunks into its messages and, like `useChat`, stops at an `error` chunk.
// - `reader`: `readUIMessageStream` over the same transport's chunks, reading to the end
//   (errors are collected, not fatal).
//
// Prints one JSON object: the `ai` version, and for each client its final assistant
// message, status and errors. This file is copied next to each installed `ai` (so that
// `import 'ai'` resolves to that version).
import { readFileSync } from 'node:fs';
import { AbstractChat, DefaultChatTransport, readUIMessageStream } from 'ai';

const body = readFileSync(0, 'utf8');
const version = JSON.parse(
  readFileSync(new URL('./node_modules/ai/package.json', import.meta.url), 'utf8'),
).version;

function transport() {
  return new DefaultChatTransport({
    api: 'http://thinkray.invalid/api/chat',
    fetch: async () =>
      new Response(body, {
        status: 200,
        headers: {
          'content-type': 'text/event-stream',
          'x-vercel-ai-ui-message-stream': 'v1',
        },
      }),
  });
}

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

const message = text => ({
  id: 'user-1',
  role: 'user',
  parts: [{ type: 'text', text }],
});

function errorText(error) {
  return error instanceof Error ? error.message : String(error);
}

async function viaChat() {
  const errors = [];
  let finish = null;
  const chat = new Chat({
    id: 'chat-1',
    transport: transport(),
    onError: error => errors.push(errorText(error)),
    onFinish: ({ isAbort, isError, isDisconnect, finishReason }) => {
      finish = { isAbort, isError, isDisconnect, finishReason };
    },
  });
  await chat.sendMessage({ text: 'hi' });
  const last = chat.messages[chat.messages.length - 1];
  return {
    status: chat.status,
    error: chat.error ? errorText(chat.error) : null,
    errors,
    finish,
    message: last && last.role === 'assistant' ? last : null,
  };
}

async function viaReader() {
  const errors = [];
  const stream = await transport().sendMessages({
    chatId: 'chat-1',
    messages: [message('hi')],
    abortSignal: undefined,
    trigger: 'submit-message',
    messageId: undefined,
  });
  let last = null;
  for await (const snapshot of readUIMessageStream({
    stream,
    onError: error => errors.push(errorText(error)),
  })) {
    last = snapshot;
  }
  return { errors, message: last };
}

const out = { version, chat: await viaChat(), reader: await viaReader() };
process.stdout.write(JSON.stringify(out));
