#!/usr/bin/env node
// Node.js side of pytest-modelparity's browser formats (tfjs:webgl, tfjs:webgl-f16, tfjs:webgpu).
//
// One process drives one headless Chromium for the whole session and gives each loaded model a
// page of its own. It speaks the Chrome DevTools protocol over --remote-debugging-pipe (file
// descriptors 3 and 4: NUL-terminated JSON), so no npm package is needed to drive the browser
// and nothing downloads a browser build: the system Chromium runs (apt-get install chromium).
// Chromium exits when that pipe closes, so it never outlives this process (nor this process
// Python: it exits on stdin EOF). Pages load tfjs from a static server bound to 127.0.0.1 on a
// free port, which serves only tfjs's browser bundles, page.html/page.js and, per loaded model,
// its model.json and the weight files its manifest names (Python checked those stay inside the
// model's directory).
//
// Usage: node browser.js <chromium executable> chromium
//   env MODELPARITY_TFJS_MODULES: node_modules holding @tensorflow/* (tfjs_runner installs it)
//   env MODELPARITY_BROWSER_START_S: how long Chromium may take to start (default 60)
//   env MODELPARITY_CHROMIUM_FLAGS: extra command-line flags (space-separated)
//
// Protocol: protocol.js's frames ([u32 LE length][type][body]) and tensor encoding.
//   Node -> Python  'S' + node version          before Chromium starts (the handshake)
//                   'H' + JSON                  once Chromium answers: {chromium, user_agent}
//                   'H' + JSON                  answer to 'L': the page's model metadata
//                   'R' + f64 ms + u8 mode + u16 count + tensors   answer to 'P' / 'I'
//                   'K'                         answer to 'C'
//                   'E' + UTF-8 message         an error (the browser keeps serving)
//   Python -> Node  'L' + JSON {model, files, backend, f16}        open a page, load the model
//                   'P' + u16 page + u16 count + tensors           predict
//                   'I' + u16 page + u32 budget + u16 n + names + tensors   intermediate nodes
//                   'C' + u16 page                                  close the page
//                   'Q'                                             quit
'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const http = require('http');
const crypto = require('crypto');
const { spawn } = require('child_process');

// First: it diverts stdout to stderr, so that only frames reach Python.
const { log, send, sendJSON, fail, decodeTensors, encodeTensor, sendAnswer, decodeFetch, serve } = require('./protocol');

const START_MS = 1000 * (Number(process.env.MODELPARITY_BROWSER_START_S) || 60);

// -- the browser bundles and the static server ------------------------------------------------
const BUNDLES = {
  'tf-core.min.js': '@tensorflow/tfjs-core/dist/tf-core.min.js',
  'tf-backend-cpu.min.js': '@tensorflow/tfjs-backend-cpu/dist/tf-backend-cpu.min.js',
  'tf-backend-webgl.min.js': '@tensorflow/tfjs-backend-webgl/dist/tf-backend-webgl.min.js',
  'tf-backend-webgpu.min.js': '@tensorflow/tfjs-backend-webgpu/dist/tf-backend-webgpu.min.js',
  'tf-converter.min.js': '@tensorflow/tfjs-converter/dist/tf-converter.min.js',
};
const PAGE_FILES = { 'page.html': 'text/html', 'page.js': 'text/javascript' };
const models = new Map(); // token -> {dir, files: Set}

function bundlePath(name) {
  const modules = process.env.MODELPARITY_TFJS_MODULES || path.join(__dirname, 'node_modules');
  return path.join(modules, BUNDLES[name]);
}

function startServer() {
  const server = http.createServer((req, res) => {
    const deny = (code) => { res.writeHead(code); res.end(); };
    if (req.method !== 'GET') return deny(405);
    // Only this server's own origin (no DNS rebinding: the Host header must be the loopback address).
    if (req.headers.host !== `127.0.0.1:${server.address().port}`) return deny(403);
    const parts = decodeURIComponent(req.url.split('?')[0]).split('/').filter(Boolean);
    let file = null;
    let type = 'application/octet-stream';
    if (parts.length === 1 && PAGE_FILES[parts[0]]) {
      file = path.join(__dirname, parts[0]);
      type = PAGE_FILES[parts[0]];
    } else if (parts.length === 2 && parts[0] === 'lib' && BUNDLES[parts[1]]) {
      file = bundlePath(parts[1]);
      type = 'text/javascript';
    } else if (parts.length >= 3 && parts[0] === 'm' && models.has(parts[1])) {
      // Only the files this model's manifest names (Python refused any leaving its directory).
      const entry = models.get(parts[1]);
      const rel = parts.slice(2).join('/');
      if (entry.files.has(rel)) file = path.join(entry.dir, rel);
      if (rel === 'model.json') type = 'application/json';
    }
    if (file === null) return deny(404);
    fs.readFile(file, (err, data) => {
      if (err) return deny(404);
      res.writeHead(200, { 'Content-Type': type, 'Cache-Control': 'no-store' });
      res.end(data);
    });
  });
  server.maxConnections = 64;
  return new Promise((resolve, reject) => {
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => resolve(server));
  });
}

// -- the DevTools protocol over a pipe --------------------------------------------------------
class DevTools {
  constructor(proc) {
    this.writer = proc.stdio[3];
    this.pending = new Map();
    this.nextId = 0;
    this.crashed = new Set();
    let chunks = [];
    proc.stdio[4].on('data', (chunk) => {
      let start = 0;
      for (let i = 0; i < chunk.length; i++) {
        if (chunk[i] !== 0) continue;
        chunks.push(chunk.subarray(start, i));
        this.dispatch(JSON.parse(Buffer.concat(chunks).toString('utf8')));
        chunks = [];
        start = i + 1;
      }
      if (start < chunk.length) chunks.push(chunk.subarray(start));
    });
  }

  dispatch(msg) {
    if (msg.id !== undefined) {
      const call = this.pending.get(msg.id);
      if (!call) return;
      this.pending.delete(msg.id);
      if (msg.error) call.reject(new Error(`${call.method}: ${msg.error.message}`));
      else call.resolve(msg.result);
    } else if (msg.method === 'Inspector.targetCrashed' && msg.sessionId) {
      this.crashed.add(msg.sessionId);
      for (const [id, call] of this.pending) {
        if (call.sessionId === msg.sessionId) {
          this.pending.delete(id);
          call.reject(new Error('the page crashed (Chromium killed its renderer: out of memory, or a GPU fault)'));
        }
      }
    }
  }

  send(method, params = {}, sessionId = undefined) {
    if (sessionId && this.crashed.has(sessionId)) {
      return Promise.reject(new Error('the page crashed earlier; load the model again'));
    }
    return new Promise((resolve, reject) => {
      const id = ++this.nextId;
      this.pending.set(id, { resolve, reject, method, sessionId });
      this.writer.write(JSON.stringify({ id, method, params, sessionId }) + '\0');
    });
  }

  async evaluate(sessionId, expression) {
    const r = await this.send('Runtime.evaluate', { expression, awaitPromise: true, returnByValue: true }, sessionId);
    if (r.exceptionDetails) {
      const ex = r.exceptionDetails.exception || {};
      const text = String(ex.description || ex.value || r.exceptionDetails.text || 'page error');
      throw new Error(text.split('\n')[0].replace(/^(Uncaught )?Error: /, ''));
    }
    return r.result.value;
  }
}

function within(ms, promise, what) {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms / 1000} s`)), ms);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

async function launch(executable) {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'modelparity-chromium-'));
  const extra = (process.env.MODELPARITY_CHROMIUM_FLAGS || '').split(/\s+/).filter(Boolean);
  const args = ['--headless=new', '--no-sandbox', '--use-angle=swiftshader', '--enable-unsafe-swiftshader',
    '--remote-debugging-pipe', '--no-first-run', '--no-default-browser-check', '--disable-extensions',
    '--disable-background-networking', '--disable-sync', '--disable-component-update', '--mute-audio',
    '--disable-dev-shm-usage', `--user-data-dir=${profile}`, ...extra, 'about:blank'];
  const proc = spawn(executable, args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
  const tail = [];
  proc.stderr.on('data', (d) => {
    for (const line of String(d).split('\n')) if (line.trim()) { tail.push(line); if (tail.length > 20) tail.shift(); }
  });
  const cleanup = () => fs.rmSync(profile, { recursive: true, force: true });
  proc.on('exit', (code, signal) => {
    cleanup();
    log(`browser: Chromium exited (${signal ? `signal ${signal}` : `code ${code}`}); last lines:\n${tail.join('\n')}`);
    process.exit(3); // Python sees the process die and starts a new browser on its next call
  });
  const started = new Promise((resolve, reject) => {
    proc.on('error', (err) => reject(new Error(`cannot start ${executable}: ${err.message}`)));
    proc.on('spawn', resolve);
  });
  await started;
  const cdp = new DevTools(proc);
  try {
    const version = await within(START_MS, cdp.send('Browser.getVersion'), `Chromium (${executable}) start-up`);
    return { proc, cdp, version };
  } catch (err) {
    proc.removeAllListeners('exit');
    proc.kill('SIGKILL'); // a browser that never answered must not outlive its failed start
    cleanup();
    throw err;
  }
}

// -- the frames ----------------------------------------------------------------------------
// Inputs go to the page as base64 in JSON; its answer comes back the same way.
const readTensors = (buf, offset) => decodeTensors(buf, offset,
  (name, dtype, shape, bytes) => ({ name, dtype, shape, b64: bytes.toString('base64') }));

function writeAnswer(answer) {
  sendAnswer(answer.ms, answer.mode,
    answer.outs.map((t) => encodeTensor(t.name, t.dtype, t.shape, Buffer.from(t.b64, 'base64'))));
}

async function main() {
  send('S', Buffer.from(process.version, 'utf8'));
  const [executable, mode] = process.argv.slice(2);
  if (!executable || mode !== 'chromium') return fail('usage: node browser.js <chromium executable> chromium');
  for (const name of Object.keys(BUNDLES)) {
    if (!fs.existsSync(bundlePath(name))) return fail(`cannot load @tensorflow/tfjs browser bundle ${bundlePath(name)}`);
  }
  let server;
  let browser;
  try {
    server = await startServer();
    browser = await launch(executable);
  } catch (err) {
    return fail(`cannot start the browser: ${err.message}`);
  }
  const { cdp, version } = browser;
  const base = `http://127.0.0.1:${server.address().port}`;
  sendJSON('H', { chromium: version.product, user_agent: version.userAgent, protocol: version.protocolVersion,
    server: base });

  const pages = new Map(); // page id -> {targetId, sessionId, token}
  let nextPage = 0;

  async function openPage(frame) {
    const req = JSON.parse(frame.toString('utf8', 1));
    const token = crypto.randomBytes(12).toString('hex');
    models.set(token, { dir: path.dirname(req.model), files: new Set(['model.json', ...req.files]) });
    const { targetId } = await cdp.send('Target.createTarget', { url: 'about:blank' });
    let sessionId;
    try {
      ({ sessionId } = await cdp.send('Target.attachToTarget', { targetId, flatten: true }));
      await cdp.send('Inspector.enable', {}, sessionId);
      await cdp.send('Page.navigate', { url: `${base}/page.html` }, sessionId);
      const deadline = Date.now() + START_MS;
      while (!(await cdp.evaluate(sessionId, 'document.readyState === "complete" && typeof mpLoad === "function"'))) {
        if (Date.now() > deadline) throw new Error(`page.html did not load within ${START_MS / 1000} s`);
        await new Promise((r) => setTimeout(r, 25));
      }
      const opts = { url: `${base}/m/${token}/model.json`, backend: req.backend, f16: !!req.f16 };
      const meta = await cdp.evaluate(sessionId, `mpLoad(${JSON.stringify(opts)})`);
      const id = ++nextPage;
      pages.set(id, { targetId, sessionId, token });
      sendJSON('H', Object.assign(meta, { page: id }));
    } catch (err) {
      models.delete(token);
      await cdp.send('Target.closeTarget', { targetId }).catch(() => {});
      throw new Error(`cannot load graph model ${req.model} on the ${req.backend} backend in Chromium: ${err.message}`);
    }
  }

  function pageOf(frame) {
    const id = frame.readUInt16LE(1);
    const page = pages.get(id);
    if (!page) throw new Error(`no page ${id} (closed, or this browser was restarted)`);
    return [id, page];
  }

  async function run(frame) {
    const [, page] = pageOf(frame);
    let offset = 3;
    let names = null;
    let budget = null;
    if (frame[0] === 'I'.charCodeAt(0)) ({ budget, names, offset } = decodeFetch(frame, offset));
    const inputs = readTensors(frame, offset);
    writeAnswer(await cdp.evaluate(page.sessionId, `mpRun(${JSON.stringify({ inputs, names, budget })})`));
  }

  async function closePage(frame) {
    const [id, page] = pageOf(frame);
    pages.delete(id);
    models.delete(page.token);
    await cdp.send('Target.closeTarget', { targetId: page.targetId }).catch(() => {});
    send('K');
  }

  serve({ L: ['load', openPage], P: ['predict', run], I: ['intermediates', run], C: ['close', closePage] });
}

main().catch((err) => fail(`browser driver crashed: ${err && err.stack ? err.stack : err}`));
