// The official openai npm package against warmpath (slowpath TestNPMOpenAIClient):
// node client.mjs <router URL> <router URL whose engine breaks streams> <model>
// prints one JSON object of what the client saw; any unexpected throw exits non-zero.
import OpenAI from 'openai';

const [base, brokenBase, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'sk-test', maxRetries: 0, timeout: 20000 });
const out = {};

const chat = await client.chat.completions.create({ model, max_tokens: 4, messages: [{ role: 'user', content: 'hello' }] });
out.chatText = chat.choices[0].message.content;

let chunks = 0;
const cs = await client.chat.completions.create({ model, max_tokens: 4, stream: true, messages: [{ role: 'user', content: 'hi' }] });
for await (const ch of cs) chunks++;
out.chatChunks = chunks;

const r = await client.responses.create({ model, instructions: 'Be terse.', input: 'first question', max_output_tokens: 5 });
out.respID = r.id;
out.respText = r.output_text;

const types = [];
let text = '';
let completed = null;
const rs = await client.responses.create({ model, input: 'follow-up', previous_response_id: r.id, stream: true, max_output_tokens: 5 });
for await (const ev of rs) {
  types.push(ev.type);
  if (ev.type === 'response.output_text.delta') text += ev.delta;
  if (ev.type === 'response.completed') completed = ev.response;
}
out.streamFirst = types[0];
out.streamLast = types[types.length - 1];
out.streamText = text;
out.streamCompletedText = completed.output_text ?? completed.output[0].content[0].text;
out.streamCached = completed.usage.input_tokens_details.cached_tokens;

const ms = await client.models.list();
out.models = ms.data.map((m) => [m.id, m.owned_by, m.max_model_len, m.root]);

try {
  await client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] });
  out.unknownModel = 'no error';
} catch (e) {
  out.unknownModel = [e.status, e.code, e.param, e.constructor.name];
}
try {
  await client.responses.create({ model, input: 'x', previous_response_id: 'resp_unknown' });
  out.unknownPrev = 'no error';
} catch (e) {
  out.unknownPrev = [e.status, e.param];
}

const bad = await fetch(base + '/v1/responses', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model":"x",' });
out.badJSON = [bad.status, (await bad.json()).error.message];

const broken = new OpenAI({ baseURL: brokenBase + '/v1', apiKey: 'sk-test', maxRetries: 0, timeout: 20000 });
let deltas = 0;
try {
  const bs = await broken.responses.create({ model, input: 'break', stream: true, max_output_tokens: 12 });
  for await (const ev of bs) if (ev.type === 'response.output_text.delta') deltas++;
  out.broken = 'no error';
} catch (e) {
  out.broken = [deltas, e.message];
}
console.log(JSON.stringify(out));
