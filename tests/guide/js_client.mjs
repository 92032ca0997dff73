// The "JavaScript/TypeScript Client Example" of the MemoryTracer API guide
// (../shared/seeds/000_2181d9a8825ccd47.txt), run by Node's built-in fetch: unchanged but for
// BASE_URL (from the environment), the model ("my_model" is the zoo's "resnet18") and the one
// TypeScript annotation (`traceId: string`) Node cannot run. The checks after the example call
// the three functions and assert the answers' fields and types as the guide lists them.
import assert from 'node:assert/strict';

const BASE_URL = process.env.BASE_URL;

// 1. Trace memory usage
async function traceMemory() {
  const response = await fetch(`${BASE_URL}/api/trace/memory`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({
      model_name: 'resnet18',
      input_shape: [8, 3, 224, 224],
      batch_size: 8,
      max_events: 10000,
      enable_fragmentation: true
    })
  });
  
  const data = await response.json();
  console.log(`Peak Memory: ${data.peak_allocated_mb.toFixed(2)} MB`);
  console.log(`Layers: ${data.total_layers}`);
  
  return data;
}

// 2. Export flame graph
async function exportFlameGraph(traceId) {
  const response = await fetch(`${BASE_URL}/api/trace/export`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({
      trace_id: traceId,
      format: 'speedscope'
    })
  });
  
  const data = await response.json();
  console.log(`Download URL: ${data.download_url}`);
  
  return data;
}

// 3. List and clean up traces
async function cleanupTraces() {
  const listResponse = await fetch(`${BASE_URL}/api/trace/list`);
  const { active_traces } = await listResponse.json();
  
  for (const traceId of active_traces) {
    await fetch(`${BASE_URL}/api/trace/${traceId}`, { method: 'DELETE' });
    console.log(`Deleted trace: ${traceId}`);
  }
}

// --- checks ---------------------------------------------------------------------------------
const data = await traceMemory();
assert.equal(typeof data.trace_id, 'string');
assert.equal(data.model_name, 'resnet18');
for (const key of ['total_events', 'total_layers']) assert.ok(Number.isInteger(data[key]) && data[key] > 0, key);
for (const key of ['peak_allocated_mb', 'peak_reserved_mb', 'avg_fragmentation', 'tracing_time_ms']) assert.equal(typeof data[key], 'number', key);
assert.equal(typeof data.layer_stats, 'object');
assert.ok(Object.keys(data.layer_stats).includes('layer1.0.conv1'));
const exported = await exportFlameGraph(data.trace_id);
assert.equal(exported.trace_id, data.trace_id);
assert.equal(exported.format, 'speedscope');
assert.ok(exported.download_url.startsWith('/api/trace/download/'));
assert.ok(Number.isInteger(exported.file_size_bytes) && exported.file_size_bytes > 0);
const flame = await (await fetch(`${BASE_URL}${exported.download_url}`)).json();
assert.ok(flame.$schema.startsWith('https://www.speedscope.app/'));
await cleanupTraces();
const after = await (await fetch(`${BASE_URL}/api/trace/list`)).json();
assert.deepEqual(after.active_traces, []);
assert.equal(after.count, 0);
console.log('GUIDE JS EXAMPLE OK');
