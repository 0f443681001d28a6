#!/usr/bin/env node
// Node.js side of pytest-modelparity's "tfjs" format.
//
// Loads one TensorFlow.js graph model (model.json + weight shards) with @tensorflow/tfjs-core +
// tfjs-converter on the CPU backend (@tensorflow/tfjs-backend-cpu) or @tensorflow/tfjs-backend-wasm, then serves predictions over stdin/stdout
// until stdin closes. One process per loaded model: Python starts it once and reuses it, so a
// warm predict costs only tfjs's compute plus a pipe round trip (a process per call costs
// 300-500 ms of `require` and load).
//
// Usage: node runner.js <model.json> <cpu|wasm>
//   env MODELPARITY_TFJS_MODULES: the node_modules directory holding @tensorflow/* (installed
//   by pytest_modelparity.runtime.tfjs_runner with `npm ci`).
//
// Protocol (both directions): frames of [u32 LE payload length][payload]; payload[0] is the
// message type. Tensors travel as raw little-endian bytes, never JSON:
//   tensor := u16 name length, name (UTF-8), u8 dtype (0 float32, 1 int32, 2 bool as u8),
//             u8 rank, rank x u32 dims, data bytes (product(dims) x itemsize)
//   Node -> Python  'S' + UTF-8 node version    first, before tfjs is required: the start-up
//                                               handshake (Python gives it a short limit of its own)
//                   'H' + UTF-8 JSON metadata   once, after the model loaded
//                   'R' + f64 compute ms + u8 mode (0 model.execute, 1 model.executeAsync)
//                       + u16 count + tensors   a prediction
//                   'E' + UTF-8 message         an error (load errors are followed by exit 1)
//   Python -> Node  'P' + u16 count + tensors   predict on these inputs
//                   'I' + u32 byte budget + u16 node count + (u16 length, UTF-8 node name) x count
//                       + u16 count + tensors   run on these inputs and return the named
//                       (intermediate) nodes' first outputs, in the order asked, as an 'R'
//                       answer whose tensors carry the node names; tensors past the byte budget
//                       or of a dtype the protocol lacks are left out (the answer says so by
//                       their absence). Used by the layer table (diagnosis).
//                   'Q'                         quit (closing stdin does the same)
'use strict';

const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');
const { performance } = require('perf_hooks');

// stdout carries only protocol frames: everything tfjs prints (its "install tfjs-node" banner,
// warnings) goes to stderr, which Python keeps as a tail for error messages. A library writing
// to process.stdout directly would corrupt the framing, so that goes to stderr too; frames are
// written with the original function.
const stdoutWrite = process.stdout.write.bind(process.stdout);
process.stdout.write = (...args) => process.stderr.write(...args);
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
  stdoutWrite(Buffer.concat([head, payload]));
}

function sendError(message) {
  send('E', Buffer.from(String(message), 'utf8'));
}

function fail(message) {
  sendError(message);
  // Let stdout drain before exiting so Python reads the whole message.
  stdoutWrite('', () => process.exit(1));
}

// Only what a graph model needs (about 100 MB installed, where the @tensorflow/tfjs bundle with
// layers, data and webgl took 308 MB): tfjs-core, the converter's graph executor and the two
// backends. The returned object carries core's API plus loadGraphModel.
function loadTfjs(backend) {
  const modules = process.env.MODELPARITY_TFJS_MODULES;
  const req = modules ? createRequire(path.join(modules, 'noop.js')) : require;
  const core = req('@tensorflow/tfjs-core');
  req('@tensorflow/tfjs-backend-cpu');
  const converter = req('@tensorflow/tfjs-converter');
  if (backend === 'wasm') req('@tensorflow/tfjs-backend-wasm');
  return Object.assign(Object.create(core), { loadGraphModel: converter.loadGraphModel, versionTfjs: core.version_core });
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
            // A symlinked shard could lead anywhere: its real path must stay inside too, and
            // it must be a regular file (a FIFO would block the read forever).
            const real = fs.realpathSync(full);
            const realDir = fs.realpathSync(dir);
            if (path.relative(realDir, real).startsWith('..') || path.isAbsolute(path.relative(realDir, real))) {
              throw new Error(`weight file ${JSON.stringify(p)} is a link leading outside ${dir} (to ${real})`);
            }
            if (!fs.statSync(real).isFile()) throw new Error(`weight file ${JSON.stringify(p)} is not a regular file`);
            buffers.push(fs.readFileSync(full));
          }
        }
        const all = Buffer.concat(buffers);
        return [specs, all.buffer.slice(all.byteOffset, all.byteOffset + all.byteLength)];
      });
    },
  };
}

// Fills `tensors` as it goes, so the caller can dispose what was made if a later tensor is bad.
// Buffer.read* throw on reads past the end; data and trailing bytes are checked here.
function decodeTensors(tf, buf, offset, tensors) {
  const count = buf.readUInt16LE(offset);
  offset += 2;
  for (let i = 0; i < count; i++) {
    const nameLen = buf.readUInt16LE(offset);
    offset += 2;
    const name = buf.toString('utf8', offset, offset + nameLen);
    offset += nameLen;
    const dtype = DTYPES[buf.readUInt8(offset)];
    if (dtype === undefined) throw new Error(`malformed frame: input ${name} has dtype code ${buf.readUInt8(offset)}`);
    const rank = buf.readUInt8(offset + 1);
    offset += 2;
    const shape = [];
    for (let d = 0; d < rank; d++) {
      shape.push(buf.readUInt32LE(offset));
      offset += 4;
    }
    const size = shape.reduce((a, b) => a * b, 1);
    const nbytes = size * ITEMSIZE[dtype];
    if (offset + nbytes > buf.length) {
      throw new Error(`malformed frame: input ${name} [${shape}] needs ${nbytes} bytes, ${buf.length - offset} left`);
    }
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
  if (offset !== buf.length) throw new Error(`malformed frame: ${buf.length - offset} bytes after the last tensor`);
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
  send('S', Buffer.from(process.version, 'utf8'));
  const [modelPath, backend = 'cpu'] = process.argv.slice(2);
  if (!modelPath) return fail('usage: node runner.js <model.json> <cpu|wasm>');
  if (backend !== 'cpu' && backend !== 'wasm') return fail(`unknown backend ${backend}; use cpu or wasm`);

  let tf;
  let model;
  const t0 = performance.now();
  try {
    tf = loadTfjs(backend);
  } catch (err) {
    return fail(`cannot load @tensorflow/tfjs (core, converter, backends): ${err.message}`);
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
    tfjs_version: tf.versionTfjs,
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
  // Graphs with control flow (While/If -> Enter/Merge/Switch...) or dynamic-shape ops refuse
  // model.execute ("Please use model.executeAsync() instead"); the first such refusal switches
  // this model to executeAsync for good. The mode is reported with every answer.
  let useAsync = false;

  // Runs the model on the inputs decoded from `buf` at `offset` and fetches `names`:
  // model.execute first; control flow switches this model to executeAsync for good.
  async function run(buf, offset, names, budget) {
    const start = performance.now();
    const inputs = {};
    let outs;
    try {
      decodeTensors(tf, buf, offset, inputs);
      if (!useAsync) {
        try {
          // tidy: an execute that throws half-way leaves no intermediate tensor behind.
          outs = tf.tidy(() => model.execute(inputs, names));
        } catch (err) {
          if (!/executeAsync/.test(err.message)) throw err;
          log(`runner: model.execute refused this graph (${err.message.split('.')[0]}); using model.executeAsync`);
          useAsync = true;
        }
      }
      if (useAsync) outs = await model.executeAsync(inputs, names);
      if (!Array.isArray(outs)) outs = [outs];
      // Within the budget and of a sendable dtype; the rest is never read back from the backend.
      const keep = [];
      let used = 0;
      for (let i = 0; i < outs.length; i++) {
        const t = outs[i];
        const nbytes = t.size * (ITEMSIZE[t.dtype] || 0);
        if (budget === null) keep.push(i);
        else if (ITEMSIZE[t.dtype] !== undefined && used + nbytes <= budget) {
          keep.push(i);
          used += nbytes;
        }
      }
      const values = await Promise.all(keep.map((i) => outs[i].data()));
      const computeMs = performance.now() - start;
      const parts = [Buffer.alloc(11)];
      parts[0].writeDoubleLE(computeMs, 0);
      parts[0].writeUInt8(useAsync ? 1 : 0, 8);
      parts[0].writeUInt16LE(keep.length, 9);
      keep.forEach((i, k) => parts.push(encodeTensor(names[i], outs[i].dtype, outs[i].shape, values[k])));
      send('R', Buffer.concat(parts));
    } finally {
      tf.dispose(inputs);
      if (outs) tf.dispose(outs);
    }
  }

  const predict = (buf) => run(buf, 1, outputNames, null);

  // 'I' frame: the byte budget, the node names to fetch, then the inputs.
  function intermediates(buf) {
    let offset = 1;
    const budget = buf.readUInt32LE(offset);
    offset += 4;
    const count = buf.readUInt16LE(offset);
    offset += 2;
    const names = [];
    for (let i = 0; i < count; i++) {
      const len = buf.readUInt16LE(offset);
      offset += 2;
      if (offset + len > buf.length) throw new Error('malformed frame: node name past the end');
      names.push(buf.toString('utf8', offset, offset + len));
      offset += len;
    }
    if (!names.length) throw new Error('no node names to fetch');
    return run(buf, offset, names, budget);
  }

  // Frames arrive in pipe-sized chunks (64 KB): keep them in a list and join once per complete
  // frame (joining on every chunk costs O(size^2): 250 ms of copying for a 12 MB batch).
  let chunks = [];
  let buffered = 0;
  let queue = Promise.resolve();
  process.stdin.on('data', (chunk) => {
    chunks.push(chunk);
    buffered += chunk.length;
    while (buffered >= 4) {
      if (chunks[0].length < 4) chunks = [Buffer.concat(chunks, buffered)];
      const len = chunks[0].readUInt32LE(0);
      if (buffered < 4 + len) break;
      const all = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, buffered);
      const frame = all.subarray(4, 4 + len);
      const rest = all.subarray(4 + len);
      chunks = rest.length ? [rest] : [];
      buffered = rest.length;
      const type = String.fromCharCode(frame[0]);
      if (type === 'Q') {
        queue = queue.then(() => process.exit(0));
      } else if (type === 'P') {
        queue = queue.then(() => predict(frame)).catch((err) => sendError(`predict failed: ${err.message}`));
      } else if (type === 'I') {
        queue = queue.then(() => intermediates(frame)).catch((err) => sendError(`intermediates failed: ${err.message}`));
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
