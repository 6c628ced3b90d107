// The Responses API through llmq, with no change but the base URL: the
// official OpenAI Node SDK's client.responses (whole, streamed, in the
// background with retrieve and cancel, a refusal as its error class) and
// the Vercel AI SDK's default model call, openai(model), which is a
// Responses API call (generateText and streamText). Any mismatch exits
// non-zero with what differed; the last line is a JSON summary the Go test
// checks against llmq's ledger.
//
// Environment: LLMQ_BASE_URL (llmq's URL ending in /v1), LLMQ_API_KEY (a
// tenant key). The model gpt-4o-mini must exist in llmq's policy and
// "no-such-model" must not.

import assert from 'node:assert/strict';

import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText } from 'ai';

const baseURL = process.env.LLMQ_BASE_URL;
const apiKey = process.env.LLMQ_API_KEY;
if (!baseURL || !apiKey) {
  console.error('responses.mjs: set LLMQ_BASE_URL (ending in /v1) and LLMQ_API_KEY');
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30_000 });
const log = (...args) => console.log('responses.mjs:', ...args);
const summary = { jobs: [], usage: [] };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Whole: output_text (the SDK joins the output's text), usage, llmq's job id.
{
  const { data, response } = await client.responses
    .create({ model: 'gpt-4o-mini', instructions: 'Be brief.', input: 'Say hello.', max_output_tokens: 30 })
    .withResponse();
  assert.equal(data.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(data.status), `status ${data.status}`);
  assert.ok(data.output_text.length > 0, 'empty output_text');
  assert.ok(data.usage.input_tokens > 0 && data.usage.output_tokens > 0, 'no usage');
  const job = response.headers.get('x-llmq-job-id');
  assert.match(job ?? '', /^job_/, 'no x-llmq-job-id');
  summary.jobs.push(job);
  summary.usage.push([data.usage.input_tokens, data.usage.output_tokens]);
  log('whole', data.usage.total_tokens, 'tokens, job', job);
}

// Items with text parts, streamed as typed events.
{
  const stream = await client.responses.create({
    model: 'gpt-4o-mini',
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Count to five.' }] }],
    max_output_tokens: 40,
    stream: true,
  });
  const types = [];
  let text = '';
  let done = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') done = ev.response;
  }
  assert.equal(types[0], 'response.created', `first event ${types[0]}`);
  assert.ok(types.includes('response.output_text.delta'), 'no text deltas');
  assert.ok(done, `no response.completed in ${types.join(',')}`);
  assert.ok(text.length > 0, 'streamed no text');
  assert.ok(done.usage.output_tokens > 0, 'no usage in response.completed');
  summary.usage.push([done.usage.input_tokens, done.usage.output_tokens]);
  log('stream', types.length, 'events,', done.usage.total_tokens, 'tokens');
}

// The SDK's stream helper, which accumulates the final response.
{
  const stream = client.responses.stream({ model: 'gpt-4o-mini', input: 'Say hello.', max_output_tokens: 20 });
  const final = await stream.finalResponse();
  assert.ok(final.output_text.length > 0, 'helper: empty output_text');
  summary.usage.push([final.usage.input_tokens, final.usage.output_tokens]);
}

// Background: llmq's job is the response until it ends.
{
  let r = await client.responses.create({ model: 'gpt-4o-mini', input: 'Say hello.', max_output_tokens: 20, background: true });
  assert.ok(['queued', 'in_progress'].includes(r.status), `background status ${r.status}`);
  const id = r.id;
  for (let i = 0; i < 300 && ['queued', 'in_progress'].includes(r.status); i++) {
    await sleep(100);
    r = await client.responses.retrieve(id);
  }
  assert.equal(r.status, 'completed', `background ended ${r.status}`);
  assert.ok(r.output_text.length > 0, 'background: empty output_text');
  summary.jobs.push(id);
  summary.usage.push([r.usage.input_tokens, r.usage.output_tokens]);
  const again = await client.responses.cancel(id);
  assert.equal(again.status, 'completed', 'cancelling a completed response changed it');
  log('background', id, r.usage.total_tokens, 'tokens');
}

// A refusal is the SDK's error class, naming the parameter.
{
  await assert.rejects(
    client.responses.create({ model: 'no-such-model', input: 'x' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'model',
  );
  await assert.rejects(
    client.responses.create({ model: 'gpt-4o-mini', input: [{ role: 'wizard', content: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'input[0].role',
  );
  await assert.rejects(client.responses.retrieve('resp_unknown'), (e) => e instanceof OpenAI.NotFoundError);
}

// The Vercel AI SDK: openai(model) is a Responses API model.
{
  const openai = createOpenAI({ baseURL, apiKey });
  const r = await generateText({ model: openai('gpt-4o-mini'), prompt: 'Say hello.', maxOutputTokens: 30, maxRetries: 0 });
  assert.ok(r.text.length > 0, 'ai sdk: empty text');
  assert.ok(r.usage.inputTokens > 0 && r.usage.outputTokens > 0, `ai sdk: usage ${JSON.stringify(r.usage)}`);
  assert.ok(r.response.body?.object === 'response' || r.providerMetadata?.openai?.responseId, 'ai sdk: not a Responses API answer');
  summary.usage.push([r.usage.inputTokens, r.usage.outputTokens]);

  const s = streamText({ model: openai('gpt-4o-mini'), prompt: 'Count to five.', maxOutputTokens: 40, maxRetries: 0 });
  let text = '';
  for await (const t of s.textStream) text += t;
  const usage = await s.usage;
  assert.ok(text.length > 0, 'ai sdk stream: empty text');
  assert.ok(usage.outputTokens > 0, `ai sdk stream: usage ${JSON.stringify(usage)}`);
  summary.usage.push([usage.inputTokens, usage.outputTokens]);
  log('ai sdk', r.usage.totalTokens, 'and', usage.totalTokens, 'tokens');
}

console.log(JSON.stringify(summary));
