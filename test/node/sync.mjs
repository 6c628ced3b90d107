// The official OpenAI Node SDK against llmq's synchronous endpoints, with no
// change but baseURL: chat (whole and streamed), embeddings, models.list,
// and llmq's refusals as the SDK's error classes. Any mismatch exits
// non-zero with what differed.
//
// Environment: LLMQ_BASE_URL (llmq's URL ending in /v1), LLMQ_API_KEY (a
// tenant key). The models gpt-4o-mini and text-embedding-3-small must exist
// in llmq's policy and "no-such-model" must not.

import assert from 'node:assert/strict';

import OpenAI from 'openai';

const baseURL = process.env.LLMQ_BASE_URL;
const apiKey = process.env.LLMQ_API_KEY;
if (!baseURL || !apiKey) {
  console.error('sync.mjs: set LLMQ_BASE_URL (ending in /v1) and LLMQ_API_KEY');
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30_000 });
const log = (...args) => console.log('sync.mjs:', ...args);
const messages = [{ role: 'user', content: 'Say hello.' }];

// Whole chat completion, with llmq's job id in the raw response.
{
  const { data, response } = await client.chat.completions
    .create({ model: 'gpt-4o-mini', messages, max_tokens: 30 })
    .withResponse();
  assert.equal(data.object, 'chat.completion');
  assert.ok(data.choices[0].message.content.length > 0, 'empty content');
  assert.ok(data.usage.total_tokens > 0, 'no usage');
  const job = response.headers.get('x-llmq-job-id');
  assert.match(job ?? '', /^job_/, 'no x-llmq-job-id');
  log('chat', data.usage.total_tokens, 'tokens, job', job);
}

// Streamed, without and with the usage chunk.
for (const includeUsage of [false, true]) {
  const stream = await client.chat.completions.create({
    model: 'gpt-4o-mini', messages, max_tokens: 30, stream: true,
    ...(includeUsage ? { stream_options: { include_usage: true } } : {}),
  });
  let text = '';
  let chunks = 0;
  let usage = null;
  for await (const chunk of stream) {
    chunks++;
    for (const c of chunk.choices) text += c.delta?.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(chunks >= 3, `only ${chunks} chunks`);
  assert.ok(text.length > 0, 'streamed no text');
  assert.equal(usage !== null, includeUsage, `usage chunk ${usage !== null}, include_usage ${includeUsage}`);
  log('stream', chunks, 'chunks', includeUsage ? `usage ${usage.total_tokens}` : 'no usage chunk');
}

// Embeddings, as floats and as the SDK's default base64.
{
  const e = await client.embeddings.create({ model: 'text-embedding-3-small', input: ['one', 'two'] });
  assert.equal(e.data.length, 2);
  assert.ok(e.data[0].embedding.length > 0, 'empty embedding');
  assert.ok(e.usage.prompt_tokens > 0, 'no usage');
  const f = await client.embeddings.create({ model: 'text-embedding-3-small', input: 'one', encoding_format: 'float' });
  assert.equal(f.data[0].embedding.length, e.data[0].embedding.length);
  log('embeddings', e.data.length, 'of', e.data[0].embedding.length);
}

// models.list pages the policy's models.
{
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes('gpt-4o-mini') && ids.includes('text-embedding-3-small'), `models ${ids}`);
  log('models', ids.join(','));
}

// A bad request is the SDK's BadRequestError, naming the param.
{
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === 'model',
  );
  await assert.rejects(
    client.chat.completions.create({ model: 'gpt-4o-mini', messages, stream: true, max_tokens: -1 }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === 'max_tokens',
  );
  log('errors ok');
}
log('ok');
