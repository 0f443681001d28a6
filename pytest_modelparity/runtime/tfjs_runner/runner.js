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
// Protocol: protocol.js's frames ([u32 LE length][type][body]) and tensor encoding.
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

// First: it diverts stdout to stderr, so that only frames reach Python.
const { ITEMSIZE, log, send, sendJSON, fail, decodeTensors, encodeTensor, sendAnswer, decodeFetch, serve } =
  require('./protocol');

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
function decodeInputs(tf, buf, offset, tensors) {
  decodeTensors(buf, offset, (name, dtype, shape, bytes) => {
    // Copy into a fresh, aligned ArrayBuffer (the frame's offset may not be 4-byte aligned).
    const raw = new Uint8Array(bytes.length);
    raw.set(bytes);
    let values;
    if (dtype === 'float32') values = new Float32Array(raw.buffer);
    else if (dtype === 'int32') values = new Int32Array(raw.buffer);
    else values = raw;
    tensors[name] = tf.tensor(values, shape, dtype);
  });
  return tensors;
}

// The raw bytes of what tensor.data() returned; bool goes as one byte (0 or 1) per value.
function dataBytes(dtype, values) {
  if (dtype === 'bool') return Buffer.from(Uint8Array.from(values));
  return Buffer.from(values.buffer, values.byteOffset, values.byteLength);
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
  sendJSON('H', meta);

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
      decodeInputs(tf, buf, offset, inputs);
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
      sendAnswer(computeMs, useAsync ? 1 : 0,
        keep.map((i, k) => encodeTensor(names[i], outs[i].dtype, outs[i].shape, dataBytes(outs[i].dtype, values[k]))));
    } finally {
      tf.dispose(inputs);
      if (outs) tf.dispose(outs);
    }
  }

  const predict = (buf) => run(buf, 1, outputNames, null);

  // 'I' frame: the byte budget, the node names to fetch, then the inputs.
  function intermediates(buf) {
    const { budget, names, offset } = decodeFetch(buf, 1);
    if (!names.length) throw new Error('no node names to fetch');
    return run(buf, offset, names, budget);
  }

  serve({ P: ['predict', predict], I: ['intermediates', intermediates] });
}

main().catch((err) => fail(`runner crashed: ${err && err.stack ? err.stack : err}`));
