// The official OpenAI Node SDK against a running llmq, as a user would drive
// it: upload a batch input file, create a batch, poll it to its end, download
// the output and error files, page the batch list, cancel a batch, and read
// llmq's errors as the SDK's error classes. Any mismatch exits non-zero with
// what differed.
//
// Environment: LLMQ_BASE_URL (llmq's URL ending in /v1), LLMQ_API_KEY (a
// tenant key). Optional: LLMQ_CANCEL_LINES, the size of the batch that is
// cancelled (default 200; 0 skips that part).
//
// The model gpt-4o-mini must exist in llmq's policy and "no-such-model" must
// not; the provider behind it must start every answer with the request's
// "user" field, as llmq's simulated provider does in tests.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Buffer } from 'node:buffer';

import OpenAI from 'openai';

// Node 18 (Debian's) has no global File, which the SDK needs for uploads.
globalThis.File ??= (await import('node:buffer')).File;

const baseURL = process.env.LLMQ_BASE_URL;
const apiKey = process.env.LLMQ_API_KEY;
if (!baseURL || !apiKey) {
  console.error('batch.mjs: set LLMQ_BASE_URL (ending in /v1) and LLMQ_API_KEY');
  process.exit(2);
}
const cancelLines = Number(process.env.LLMQ_CANCEL_LINES ?? 200);

const client = new OpenAI({ baseURL, apiKey, maxRetries: 3, timeout: 30_000 });
const TERMINAL = new Set(['completed', 'failed', 'expired', 'cancelled']);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (...args) => console.log('batch.mjs:', ...args);

// inputFile writes an OpenAI batch input file: good chat requests, then bad
// ones asking for a model llmq does not have.
function inputFile(name, good, bad) {
  const lines = [];
  for (let i = 0; i < good; i++) {
    lines.push({
      custom_id: `ok-${i}`,
      method: 'POST',
      url: '/v1/chat/completions',
      body: {
        model: 'gpt-4o-mini',
        messages: [{ role: 'user', content: `Question ${i}: name a prime number.` }],
        max_tokens: 20,
        user: `ok-${i}`,
      },
    });
  }
  for (let i = 0; i < bad; i++) {
    lines.push({
      custom_id: `bad-${i}`,
      method: 'POST',
      url: '/v1/chat/completions',
      body: { model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 20 },
    });
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llmq-node-'));
  const file = path.join(dir, name);
  fs.writeFileSync(file, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
  return file;
}

// waitFor polls a batch until it reaches a final status.
async function waitFor(id, timeoutMs = 120_000) {
  const deadline = Date.now() + timeoutMs;
  for (let delay = 100; ; delay = Math.min(delay * 1.5, 1000)) {
    const b = await client.batches.retrieve(id);
    if (TERMINAL.has(b.status)) return b;
    if (Date.now() > deadline) {
      throw new Error(`batch ${id} still ${b.status} after ${timeoutMs} ms: ${JSON.stringify(b.request_counts)}`);
    }
    await sleep(delay);
  }
}

// jsonLines downloads a file and parses its lines.
async function jsonLines(fileID) {
  const resp = await client.files.content(fileID);
  const text = await resp.text();
  assert.ok(text === '' || text.endsWith('\n'), `file ${fileID} does not end with a newline`);
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map((l, i) => {
      try {
        return JSON.parse(l);
      } catch (e) {
        throw new Error(`file ${fileID} line ${i + 1} is not JSON: ${l}`);
      }
    });
}

// 1. Upload, as the SDK's docs show: a read stream with purpose "batch".
const good = 6;
const bad = 2;
const inputPath = inputFile('requests.jsonl', good, bad);
const size = fs.statSync(inputPath).size;
const file = await client.files.create({ file: fs.createReadStream(inputPath), purpose: 'batch' });
assert.match(file.id, /^file-/, 'file id');
assert.equal(file.object, 'file');
assert.equal(file.purpose, 'batch');
assert.equal(file.bytes, size, 'uploaded bytes');
assert.equal(file.filename, 'requests.jsonl');
const again = await client.files.retrieve(file.id);
assert.equal(again.id, file.id);
assert.equal(again.bytes, size);
const stored = await (await client.files.content(file.id)).text();
assert.equal(stored, fs.readFileSync(inputPath, 'utf8'), 'the stored input file differs from the upload');
log('uploaded', file.id, `(${size} bytes)`);

// 2. Create the batch.
const created = await client.batches.create({
  input_file_id: file.id,
  endpoint: '/v1/chat/completions',
  completion_window: '24h',
  metadata: { suite: 'node-sdk' },
});
assert.match(created.id, /^batch_/, 'batch id');
assert.equal(created.object, 'batch');
assert.equal(created.input_file_id, file.id);
assert.equal(created.endpoint, '/v1/chat/completions');
assert.equal(created.completion_window, '24h');
assert.deepEqual(created.metadata, { suite: 'node-sdk' });
assert.ok(['validating', 'in_progress', 'finalizing', 'completed'].includes(created.status), `new batch status ${created.status}`);
log('created', created.id, created.status);

// 3. Poll to the end.
const batch = await waitFor(created.id);
assert.equal(batch.status, 'completed', `batch ended ${batch.status}: ${JSON.stringify(batch.errors)}`);
assert.deepEqual(batch.request_counts, { total: good + bad, completed: good, failed: bad }, 'request counts');
assert.ok(batch.output_file_id, 'no output_file_id');
assert.ok(batch.error_file_id, 'no error_file_id');
assert.ok(batch.completed_at >= batch.created_at, 'completed_at');
log('completed', JSON.stringify(batch.request_counts));

// 4. The output file: one line per good request, OpenAI's shape.
const outFile = await client.files.retrieve(batch.output_file_id);
assert.equal(outFile.purpose, 'batch_output');
const output = await jsonLines(batch.output_file_id);
assert.equal(output.length, good, 'output lines');
assert.deepEqual(output.map((l) => l.custom_id).sort(), Array.from({ length: good }, (_, i) => `ok-${i}`).sort());
for (const line of output) {
  assert.equal(typeof line.id, 'string', 'output line id');
  assert.equal(line.error, null, `output line ${line.custom_id} has an error`);
  assert.equal(line.response.status_code, 200);
  assert.equal(typeof line.response.request_id, 'string');
  const body = line.response.body;
  assert.equal(body.object, 'chat.completion');
  assert.ok(body.choices[0].message.content.startsWith(line.custom_id), `answer of ${line.custom_id}: ${body.choices[0].message.content}`);
  assert.ok(body.usage.total_tokens > 0, 'usage');
}

// 5. The error file: one line per bad request, with why.
const errors = await jsonLines(batch.error_file_id);
assert.equal(errors.length, bad, 'error lines');
assert.deepEqual(errors.map((l) => l.custom_id).sort(), Array.from({ length: bad }, (_, i) => `bad-${i}`).sort());
for (const line of errors) {
  assert.equal(typeof line.id, 'string', 'error line id');
  const why = line.error?.message ?? JSON.stringify(line.response?.body);
  assert.ok(line.error !== null || line.response?.status_code >= 400, `error line ${line.custom_id} says nothing went wrong`);
  assert.match(why, /no-such-model/, `error line ${line.custom_id} does not name the model`);
}
log('output and error files ok');

// 6. The list, paged by the SDK's auto-pagination one batch per page.
const seen = [];
for await (const b of client.batches.list({ limit: 1 })) seen.push(b.id);
assert.ok(seen.includes(batch.id), `batches.list lacks ${batch.id}: ${seen}`);
assert.equal(new Set(seen).size, seen.length, 'batches.list repeats a batch');

// 7. Cancel a larger batch while it runs: it ends cancelled, what ran is in
// its output file, and every request that did not run is in its error file.
if (cancelLines > 0) {
  const big = await client.files.create({ file: fs.createReadStream(inputFile('big.jsonl', cancelLines, 0)), purpose: 'batch' });
  const b = await client.batches.create({ input_file_id: big.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  let running = b;
  for (const deadline = Date.now() + 30_000; running.status === 'validating'; await sleep(20)) {
    assert.ok(Date.now() < deadline, `batch ${b.id} still validating after 30 s`);
    running = await client.batches.retrieve(b.id);
  }
  assert.equal(running.status, 'in_progress', `batch ${b.id} ended before it could be cancelled`);
  const cancelling = await client.batches.cancel(b.id);
  assert.ok(['cancelling', 'cancelled'].includes(cancelling.status), `cancel answered ${cancelling.status}`);
  assert.ok(cancelling.cancelling_at >= cancelling.created_at, 'cancelling_at');
  const ended = await waitFor(b.id);
  assert.equal(ended.status, 'cancelled');
  const rc = ended.request_counts;
  assert.equal(rc.total, cancelLines, 'total of the cancelled batch');
  assert.equal(rc.completed + rc.failed, rc.total, `counts of the cancelled batch: ${JSON.stringify(rc)}`);
  assert.ok(rc.failed > 0, `all ${cancelLines} requests ran although the batch was cancelled while running`);
  const ran = ended.output_file_id ? await jsonLines(ended.output_file_id) : [];
  assert.equal(ran.length, rc.completed, 'output lines of the cancelled batch');
  const notRun = ended.error_file_id ? await jsonLines(ended.error_file_id) : [];
  assert.equal(notRun.length, rc.failed, 'error lines of the cancelled batch');
  for (const line of notRun) assert.ok(line.error?.code, `error line ${line.custom_id} has no error code`);
  log('cancelled', b.id, JSON.stringify(rc));
}

// 8. llmq's errors are the SDK's error classes.
await assert.rejects(client.batches.retrieve('batch_doesnotexist'), OpenAI.NotFoundError);
await assert.rejects(
  client.batches.create({ input_file_id: 'file-doesnotexist', endpoint: '/v1/chat/completions', completion_window: '24h' }),
  (e) => e instanceof OpenAI.APIError && (e.status === 400 || e.status === 404),
);
const stranger = new OpenAI({ baseURL, apiKey: 'llmq_not_a_key', maxRetries: 0 });
await assert.rejects(stranger.files.retrieve(file.id), OpenAI.AuthenticationError);
// A File built in memory uploads too.
const one = Buffer.from(fs.readFileSync(inputPath, 'utf8').split('\n')[0] + '\n');
const upload = await client.files.create({ file: new File([one], 'one.jsonl'), purpose: 'batch' });
assert.equal(upload.bytes, one.length);
log('errors ok');

console.log('batch.mjs: all checks passed');
