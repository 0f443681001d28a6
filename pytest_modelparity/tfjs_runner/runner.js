#!/usr/bin/env node
// Node.js side of pytest-modelparity's "tfjs" format.
//
// Loads one TensorFlow.js graph model (model.json + weight shards) with pure @tensorflow/tfjs
// (CPU backend) or @tensorflow/tfjs-backend-wasm, then serves predictions over stdin/stdout
// until stdin closes. One process per loaded model: Python starts it once and reuses it, so a
// warm predict costs only tfjs's compute plus a pipe round trip (a process per call costs
// 300-500 ms of `require` and load).
//
// Usage: node runner.js <model.json> <cpu|wasm>
//   env MODELPARITY_TFJS_MODULES: the node_modules directory holding @tensorflow/* (installed
//   by pytest_modelparity.tfjs_runner with `npm ci`).
//
// Protocol (both directions): frames of [u32 LE payload length][payload]; payload[0] is the
// message type. Tensors travel as raw little-endian bytes, never JSON:
//   tensor := u16 name length, name (UTF-8), u8 dtype (0 float32, 1 int32, 2 bool as u8),
//             u8 rank, rank x u32 dims, data bytes (product(dims) x itemsize)
//   Node -> Python  'H' + UTF-8 JSON metadata   once, after the model loaded
//                   'R' + f64 compute ms + u16 count + tensors   a prediction
//                   'E' + UTF-8 message         an error (load errors are followed by exit 1)
//   Python -> Node  'P' + u16 count + tensors   predict on these inputs
//                   'Q'                         quit (closing stdin does the same)
'use strict';

const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');
const { performance } = require('perf_hooks');

// stdout carries only protocol frames: everything tfjs prints (its "install tfjs-node" banner,
// warnings) goes to stderr, which Python keeps as a tail for error messages.
const log = (...args) => process.stderr.write(args.map(String).join(' ') + '\n');
console.log = log;
console.info = log;
console.warn = log;
console.debug = log;

const DTYPES = ['float32', 'int32', 'bool'];
const ITEMSIZE = { float32: 4, int32: 4, bool: 1 };

function send(type, body) {
  const payload = Buffer.concat([Buffer.from(type, 'latin1'), body]);
  const head = Buffer.alloc(4);
  head.writeUInt32LE(payload.length, 0);
  process.stdout.write(Buffer.concat([head, payload]));
}

function sendError(message) {
  send('E', Buffer.from(String(message), 'utf8'));
}

function fail(message) {
  sendError(message);
  // Let stdout drain before exiting so Python reads the whole message.
  process.stdout.write('', () => process.exit(1));
}

function loadTfjs(backend) {
  const modules = process.env.MODELPARITY_TFJS_MODULES;
  const req = modules ? createRequire(path.join(modules, 'noop.js')) : require;
  const tf = req('@tensorflow/tfjs');
  if (backend === 'wasm') req('@tensorflow/tfjs-backend-wasm');
  return tf;
}

// Pure @tensorflow/tfjs has no file-system loader: read model.json and its shards with fs.
// Python has already refused weight paths leaving the model's directory; checked again here.
function fileHandler(tf, modelPath) {
  const dir = path.dirname(path.resolve(modelPath));
  return {
    load: async () => {
      const modelJSON = JSON.parse(fs.readFileSync(modelPath, 'utf8'));
      return tf.io.getModelArtifactsForJSON(modelJSON, async (manifest) => {
        const specs = [];
        const buffers = [];
        for (const group of manifest) {
          specs.push(...group.weights);
          for (const p of group.paths) {
            const full = path.resolve(dir, p);
            if (path.relative(dir, full).startsWith('..') || path.isAbsolute(path.relative(dir, full))) {
              throw new Error(`weight path ${JSON.stringify(p)} points outside ${dir}`);
            }
            buffers.push(fs.readFileSync(full));
          }
        }
        const all = Buffer.concat(buffers);
        return [specs, all.buffer.slice(all.byteOffset, all.byteOffset + all.byteLength)];
      });
    },
  };
}

function decodeTensors(tf, buf, offset) {
  const count = buf.readUInt16LE(offset);
  offset += 2;
  const tensors = {};
  for (let i = 0; i < count; i++) {
    const nameLen = buf.readUInt16LE(offset);
    offset += 2;
    const name = buf.toString('utf8', offset, offset + nameLen);
    offset += nameLen;
    const dtype = DTYPES[buf.readUInt8(offset)];
    const rank = buf.readUInt8(offset + 1);
    offset += 2;
    const shape = [];
    for (let d = 0; d < rank; d++) {
      shape.push(buf.readUInt32LE(offset));
      offset += 4;
    }
    const size = shape.reduce((a, b) => a * b, 1);
    const nbytes = size * ITEMSIZE[dtype];
    // Copy into a fresh, aligned ArrayBuffer (the frame's offset may not be 4-byte aligned).
    const raw = new Uint8Array(nbytes);
    raw.set(buf.subarray(offset, offset + nbytes));
    offset += nbytes;
    let values;
    if (dtype === 'float32') values = new Float32Array(raw.buffer);
    else if (dtype === 'int32') values = new Int32Array(raw.buffer);
    else values = raw;
    tensors[name] = tf.tensor(values, shape, dtype);
  }
  return tensors;
}

function encodeTensor(name, dtype, shape, values) {
  const code = DTYPES.indexOf(dtype);
  if (code < 0) throw new Error(`output ${name} has dtype ${dtype}, which the runner cannot send`);
  const nameBytes = Buffer.from(name, 'utf8');
  const head = Buffer.alloc(2 + nameBytes.length + 2 + 4 * shape.length);
  let o = head.writeUInt16LE(nameBytes.length, 0);
  o += nameBytes.copy(head, o);
  o = head.writeUInt8(code, o);
  o = head.writeUInt8(shape.length, o);
  for (const d of shape) o = head.writeUInt32LE(d, o);
  let data;
  if (dtype === 'bool') data = Buffer.from(Uint8Array.from(values));
  else data = Buffer.from(values.buffer, values.byteOffset, values.byteLength);
  return Buffer.concat([head, data]);
}

async function main() {
  const [modelPath, backend = 'cpu'] = process.argv.slice(2);
  if (!modelPath) return fail('usage: node runner.js <model.json> <cpu|wasm>');
  if (backend !== 'cpu' && backend !== 'wasm') return fail(`unknown backend ${backend}; use cpu or wasm`);

  let tf;
  let model;
  const t0 = performance.now();
  try {
    tf = loadTfjs(backend);
  } catch (err) {
    return fail(`cannot load @tensorflow/tfjs: ${err.message}`);
  }
  const t1 = performance.now();
  try {
    if (!(await tf.setBackend(backend))) throw new Error(`tf.setBackend('${backend}') failed`);
    await tf.ready();
    model = await tf.loadGraphModel(fileHandler(tf, modelPath));
  } catch (err) {
    return fail(`cannot load graph model ${modelPath} on the ${backend} backend: ${err.message}`);
  }
  const t2 = performance.now();

  const meta = {
    tfjs_version: tf.version.tfjs,
    backend: tf.getBackend(),
    require_ms: t1 - t0,
    load_ms: t2 - t1,
    inputs: model.inputNodes.map((name, i) => ({
      name, shape: (model.inputs[i] || {}).shape || null, dtype: (model.inputs[i] || {}).dtype || null,
    })),
    outputs: model.outputNodes.map((name, i) => ({
      name, shape: (model.outputs[i] || {}).shape || null, dtype: (model.outputs[i] || {}).dtype || null,
    })),
  };
  send('H', Buffer.from(JSON.stringify(meta), 'utf8'));

  const outputNames = model.outputNodes;
  let useAsync = false;

  async function predict(buf) {
    const start = performance.now();
    const inputs = decodeTensors(tf, buf, 1);
    let outs;
    try {
      if (!useAsync) {
        try {
          outs = model.execute(inputs, outputNames);
        } catch (err) {
          // Graphs with control flow or dynamic shapes must run asynchronously.
          if (!/executeAsync/.test(err.message)) throw err;
          useAsync = true;
        }
      }
      if (useAsync) outs = await model.executeAsync(inputs, outputNames);
      if (!Array.isArray(outs)) outs = [outs];
      const values = await Promise.all(outs.map((t) => t.data()));
      const computeMs = performance.now() - start;
      const parts = [Buffer.alloc(10)];
      parts[0].writeDoubleLE(computeMs, 0);
      parts[0].writeUInt16LE(outs.length, 8);
      outs.forEach((t, i) => parts.push(encodeTensor(outputNames[i], t.dtype, t.shape, values[i])));
      send('R', Buffer.concat(parts));
    } finally {
      tf.dispose(inputs);
      if (outs) tf.dispose(outs);
    }
  }

  // Frames arrive in arbitrary chunks: buffer them, handle complete frames one at a time.
  let pending = Buffer.alloc(0);
  let queue = Promise.resolve();
  process.stdin.on('data', (chunk) => {
    pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
    while (pending.length >= 4) {
      const len = pending.readUInt32LE(0);
      if (pending.length < 4 + len) break;
      const frame = pending.subarray(4, 4 + len);
      pending = pending.subarray(4 + len);
      const type = String.fromCharCode(frame[0]);
      if (type === 'Q') {
        queue = queue.then(() => process.exit(0));
      } else if (type === 'P') {
        queue = queue.then(() => predict(frame)).catch((err) => sendError(`predict failed: ${err.message}`));
      } else {
        queue = queue.then(() => sendError(`unknown message type ${JSON.stringify(type)}`));
      }
    }
  });
  // Python gone (exit, crash, kill): stdin reaches EOF, and the runner must not outlive it.
  process.stdin.on('end', () => queue.then(() => process.exit(0)));
  process.stdin.on('error', () => process.exit(0));
  process.stdout.on('error', () => process.exit(0));
}

main().catch((err) => fail(`runner crashed: ${err && err.stack ? err.stack : err}`));
