// The official OpenAI Node SDK against llmq when the provider fails its
// streams midway (an error chunk on chat, an error or response.failed
// event on the Responses API), with no change but baseURL: a chat stream
// throws the SDK's APIError after its first chunks; a Responses stream
// yields its events and ends with an event of type error, never
// response.completed; the SDK's stream helper rejects. Any mismatch exits
// non-zero with what differed; the last line is a JSON summary of llmq's
// job ids.
//
// Environment: LLMQ_BASE_URL (llmq's URL ending in /v1), LLMQ_API_KEY (a
// tenant key). The provider behind llmq must fail every stream.

import assert from 'node:assert/strict';

import OpenAI from 'openai';

const baseURL = process.env.LLMQ_BASE_URL;
const apiKey = process.env.LLMQ_API_KEY;
if (!baseURL || !apiKey) {
  console.error('stream_error.mjs: set LLMQ_BASE_URL (ending in /v1) and LLMQ_API_KEY');
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30_000 });
const log = (...args) => console.log('stream_error.mjs:', ...args);
const jobs = [];

// Chat: the SDK throws on the error chunk, after the chunks relayed before it.
{
  const { data: stream, response } = await client.chat.completions
    .create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Tell a story.' }], max_tokens: 100, stream: true })
    .withResponse();
  jobs.push(response.headers.get('x-llmq-job-id'));
  let chunks = 0;
  await assert.rejects(
    (async () => {
      for await (const _ of stream) chunks++;
    })(),
    (err) => err instanceof OpenAI.APIError && /The server had an error/.test(err.message),
  );
  assert.ok(chunks >= 1, `chat: ${chunks} chunks before the error`);
  log('chat', chunks, 'chunks, then the error');
}

// Responses: typed events, then one of type error; no response.completed.
for (let i = 0; i < 2; i++) {
  const { data: stream, response } = await client.responses
    .create({ model: 'gpt-4o-mini', input: 'Tell a story.', max_output_tokens: 100, stream: true })
    .withResponse();
  jobs.push(response.headers.get('x-llmq-job-id'));
  const events = [];
  for await (const ev of stream) events.push(ev);
  const types = events.map((ev) => ev.type);
  const last = events[events.length - 1];
  assert.equal(types[0], 'response.created', `first event ${types[0]}`);
  assert.ok(types.includes('response.output_text.delta'), `no delta before the error: ${types}`);
  assert.ok(!types.includes('response.completed'), 'a failed stream completed');
  assert.equal(last.type, 'error', `last event ${last.type}`);
  assert.equal(last.code, 'server_error');
  assert.match(last.message, /The server had an error/);
  log('responses', types.length, 'events, ending with', last.type);
}

// The SDK's stream helper rejects: the stream produced no response.
{
  const stream = client.responses.stream({ model: 'gpt-4o-mini', input: 'Tell a story.', max_output_tokens: 100 });
  await assert.rejects(stream.finalResponse());
  log('helper rejected');
}

for (const job of jobs) assert.match(job ?? '', /^job_/, 'no x-llmq-job-id');
console.log(JSON.stringify({ jobs }));
