// The official OpenAI Node SDK's batch flow, written exactly as a user
// writes it, against an llmq whose tenant's tier offloads batches to the
// provider's Batch API (batch_offload: auto): upload an input file, create
// a batch, poll it to its end, download and parse the output file. Nothing
// here knows about the offload; the Go test that runs the script
// (test/offload_sdk_test.go) checks, from the one JSON line the script
// prints last ("result: {...}"), that the batch completed with every line
// answered and, from llmq's side, that the lines ran at the provider.
//
// Environment: LLMQ_BASE_URL (llmq's URL ending in /v1), LLMQ_API_KEY (a
// tenant key). Optional: LLMQ_LINES, the batch's size (default 50). The
// model gpt-4o-mini must exist in llmq's policy.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import OpenAI from 'openai';

// Node 18 (Debian's) has no global File, which the SDK needs for uploads.
globalThis.File ??= (await import('node:buffer')).File;

const baseURL = process.env.LLMQ_BASE_URL;
const apiKey = process.env.LLMQ_API_KEY;
if (!baseURL || !apiKey) {
  console.error('offload.mjs: set LLMQ_BASE_URL (ending in /v1) and LLMQ_API_KEY');
  process.exit(2);
}
const lines = Number(process.env.LLMQ_LINES ?? 50);

const client = new OpenAI({ baseURL, apiKey, maxRetries: 3, timeout: 30_000 });
const TERMINAL = new Set(['completed', 'failed', 'expired', 'cancelled']);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (...args) => console.log('offload.mjs:', ...args);

// The input file, as the OpenAI docs show it: one request per line.
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llmq-offload-'));
const inputPath = path.join(dir, 'requests.jsonl');
const requests = [];
for (let i = 0; i < lines; i++) {
  requests.push({
    custom_id: `req-${i}`,
    method: 'POST',
    url: '/v1/chat/completions',
    body: {
      model: 'gpt-4o-mini',
      messages: [{ role: 'user', content: `Request ${i}: name a colour.` }],
      max_tokens: 20,
      user: `req-${i}`,
    },
  });
}
fs.writeFileSync(inputPath, requests.map((r) => JSON.stringify(r)).join('\n') + '\n');

const file = await client.files.create({ file: fs.createReadStream(inputPath), purpose: 'batch' });
log('uploaded', file.id, `(${file.bytes} bytes)`);

const created = await client.batches.create({
  input_file_id: file.id,
  endpoint: '/v1/chat/completions',
  completion_window: '24h',
});
log('created', created.id, created.status);

let batch = created;
const deadline = Date.now() + 120_000;
for (let delay = 200; !TERMINAL.has(batch.status); delay = Math.min(delay * 1.5, 1000)) {
  if (Date.now() > deadline) {
    console.error(`offload.mjs: batch ${batch.id} still ${batch.status} after 120 s: ${JSON.stringify(batch.request_counts)}`);
    process.exit(1);
  }
  await sleep(delay);
  batch = await client.batches.retrieve(created.id);
}
log('ended', batch.status, JSON.stringify(batch.request_counts));

let output = [];
if (batch.output_file_id) {
  const resp = await client.files.content(batch.output_file_id);
  const text = await resp.text();
  output = text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l));
}
let errors = [];
if (batch.error_file_id) {
  const resp = await client.files.content(batch.error_file_id);
  errors = (await resp.text())
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l));
}

console.log('result: ' + JSON.stringify({ file, created, batch, output, errors }));
