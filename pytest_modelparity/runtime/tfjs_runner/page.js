// pytest-modelparity: what a browser page does with one TFJS graph model (see browser.js).
// mpLoad({url, backend, f16}) loads it on the WebGL (float32 or forced float16 textures) or
// WebGPU backend and says what runs it; mpRun({inputs, names, budget}) predicts (names null)
// or fetches intermediate nodes. Tensors travel as base64 of little-endian bytes.
'use strict';

let model = null;
let useAsync = false;
const ITEMSIZE = { float32: 4, int32: 4, bool: 1 };

function fromBase64(t) {
  const bin = atob(t.b64);
  const raw = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) raw[i] = bin.charCodeAt(i);
  if (t.dtype === 'float32') return new Float32Array(raw.buffer);
  if (t.dtype === 'int32') return new Int32Array(raw.buffer);
  return raw;
}

function toBase64(values, dtype) {
  const bytes = dtype === 'bool' ? Uint8Array.from(values)
    : new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

function loadScript(src) {
  return new Promise((resolve, reject) => {
    const s = document.createElement('script');
    s.src = src;
    s.onload = resolve;
    s.onerror = () => reject(new Error(`cannot load ${src}`));
    document.head.appendChild(s);
  });
}

async function webgpuAdapter() {
  if (!navigator.gpu) return 'navigator.gpu is undefined (this Chromium exposes no WebGPU)';
  const timeout = new Promise((resolve) => setTimeout(() => resolve('timeout'), 5000));
  const adapter = await Promise.race([navigator.gpu.requestAdapter(), timeout]).catch((e) => `error ${e.message}`);
  if (adapter === 'timeout') return 'navigator.gpu.requestAdapter() gave no answer within 5 s';
  if (typeof adapter === 'string') return `navigator.gpu.requestAdapter() failed (${adapter})`;
  if (!adapter) return 'navigator.gpu.requestAdapter() returned null (Chromium offers no WebGPU adapter here)';
  return null;
}

function renderer() {
  const gl = tf.backend().gpgpu && tf.backend().gpgpu.gl;
  if (!gl) return null;
  const ext = gl.getExtension('WEBGL_debug_renderer_info');
  return String(gl.getParameter(ext ? ext.UNMASKED_RENDERER_WEBGL : gl.RENDERER));
}

async function mpLoad(opts) {
  if (opts.backend === 'webgpu') {
    const missing = await webgpuAdapter();
    if (missing) throw new Error(`no WebGPU adapter: ${missing}`);
    await loadScript('/lib/tf-backend-webgpu.min.js');
  }
  if (opts.backend === 'webgl') tf.env().set('WEBGL_FORCE_F16_TEXTURES', !!opts.f16);
  if (!(await tf.setBackend(opts.backend))) {
    throw new Error(`tf.setBackend('${opts.backend}') failed: this Chromium gives the page no ${opts.backend} context`);
  }
  await tf.ready();
  model = await tf.loadGraphModel(opts.url);
  const env = tf.env();
  const info = { tfjs_version: tf.version_core, backend: tf.getBackend(), renderer: null, textures: null };
  if (opts.backend === 'webgl') {
    info.renderer = renderer();
    info.webgl_version = env.getNumber('WEBGL_VERSION');
    // Without float32 render targets tfjs silently stores float16: say what really ran.
    info.textures = env.getBool('WEBGL_FORCE_F16_TEXTURES') || !env.getBool('WEBGL_RENDER_FLOAT32_ENABLED')
      ? 'float16' : 'float32';
  } else if (opts.backend === 'webgpu') {
    info.textures = 'float32';
  }
  info.inputs = model.inputNodes.map((name, i) => ({
    name, shape: (model.inputs[i] || {}).shape || null, dtype: (model.inputs[i] || {}).dtype || null,
  }));
  info.outputs = model.outputNodes.map((name, i) => ({
    name, shape: (model.outputs[i] || {}).shape || null, dtype: (model.outputs[i] || {}).dtype || null,
  }));
  return info;
}

async function mpRun(req) {
  const start = performance.now();
  const names = req.names || model.outputNodes;
  const inputs = {};
  let outs;
  try {
    for (const t of req.inputs) inputs[t.name] = tf.tensor(fromBase64(t), t.shape, t.dtype);
    if (!useAsync) {
      try {
        outs = tf.tidy(() => model.execute(inputs, names));
      } catch (err) {
        if (!/executeAsync/.test(err.message)) throw err;
        useAsync = true;
      }
    }
    if (useAsync) outs = await model.executeAsync(inputs, names);
    if (!Array.isArray(outs)) outs = [outs];
    const keep = [];
    let used = 0;
    outs.forEach((t, i) => {
      const nbytes = t.size * (ITEMSIZE[t.dtype] || 0);
      if (req.budget === null) keep.push(i);
      else if (ITEMSIZE[t.dtype] !== undefined && used + nbytes <= req.budget) { keep.push(i); used += nbytes; }
    });
    const values = await Promise.all(keep.map((i) => outs[i].data()));
    return {
      ms: performance.now() - start, mode: useAsync ? 1 : 0,
      outs: keep.map((i, k) => ({ name: names[i], dtype: outs[i].dtype, shape: outs[i].shape,
        b64: toBase64(values[k], outs[i].dtype) })),
    };
  } finally {
    tf.dispose(Object.values(inputs));
    if (outs) tf.dispose(outs);
  }
}
