#!/usr/bin/env node
// Node.js side of pytest-modelparity's browser formats (tfjs:webgl, tfjs:webgl-f16, tfjs:webgpu).
//
// One process drives one headless Chromium for the whole session and gives each loaded model a
// page of its own. It speaks the Chrome DevTools protocol over --remote-debugging-pipe (file
// descriptors 3 and 4: NUL-terminated JSON), so no npm package is needed to drive the browser
// and nothing downloads a browser build: the system Chromium runs (apt-get install chromium).
// Chromium exits when that pipe closes, so it never outlives this process (nor this process
// Python: it exits on stdin EOF, and on SIGTERM, Python's death signal). Pages load tfjs through
// this process (relayFetch) from a static server bound to 127.0.0.1 on a free port, which serves
// only tfjs's browser bundles,
// page.html/page.js and, per loaded model, its model.json and the weight files its manifest names,
// each only if, at the request, it is a regular file at that very path inside the model's
// directory (no link anywhere below it); a request it cannot parse is answered 400.
//
// The browser stays home: its pages make no network request at all. Each page's requests are
// paused by the DevTools protocol (Fetch, at the request stage) and answered by this process, which
// fetches them from the static server itself (relayFetch below): Chromium's network stack never
// sees them, so it never resolves a host, not even 127.0.0.1, and never runs its IPv6 reachability
// probe (a UDP connect() to 2001:4860:4860::8888 before any host resolution, which no flag turns
// off). Every flag that stops Chromium's own traffic (updates, variations, network time, AI-mode
// eligibility, DNS and DNS-over-HTTPS, crash upload) is set, host names other than localhost
// resolve to nothing, and any other request goes to a loopback sink that closes it (CHROMIUM_FLAGS).
// Everything it writes (profile, crash dumps, $HOME and XDG folders, temporaries) goes under the
// session folder Python made (MODELPARITY_BROWSER_DIR), which this script empties on every exit
// and Python removes.
//
// Usage: node browser.js <chromium executable> chromium
//   env MODELPARITY_BROWSER_DIR: the session's own folder (Python creates it and removes it)
//   env MODELPARITY_BROWSER_GROUP=1: this process leads its own process group (Python started it
//     so): on exit it kills that group, taking any process Chromium left behind with it
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
const net = require('net');
const crypto = require('crypto');
const { spawn } = require('child_process');

// First: it diverts stdout to stderr, so that only frames reach Python.
const { log, send, sendJSON, sendError, sendDrained, fail, decodeTensors, encodeTensor, sendAnswer, decodeFetch, serve } = require('./protocol');

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

// Why a file is not served: the model's file as it is now, checked at each request. Opened
// without following a final link (and without blocking: a FIFO put there must not hang a thread
// of the pool), it must be a regular file, and the path must resolve to itself inside the model's
// directory as resolved at load (no link in between), the same file as opened.
function openModelFile(entry, rel, done) {
  const file = path.join(entry.dir, rel);
  const flags = fs.constants.O_RDONLY | (fs.constants.O_NOFOLLOW || 0) | (fs.constants.O_NONBLOCK || 0);
  fs.open(file, flags, (err, fd) => {
    if (err) {
      const why = err.code === 'ELOOP' ? 'is a symbolic link now' : `cannot be opened (${err.code || err.message})`;
      return done(`${rel} ${why}`);
    }
    const refuse = (why) => fs.close(fd, () => done(`${rel} ${why}`));
    fs.fstat(fd, (err2, st) => {
      if (err2) return refuse(`cannot be read (${err2.code})`);
      if (!st.isFile()) return refuse('is not a regular file now');
      fs.realpath(file, (err3, real) => {
        if (err3) return refuse(`cannot be resolved (${err3.code})`);
        if (real !== path.join(entry.realDir, rel)) return refuse(`leads out of place through a link now (to ${real})`);
        fs.stat(real, (err4, st2) => {
          if (err4 || st2.ino !== st.ino || st2.dev !== st.dev) return refuse('changed while it was opened');
          done(null, fd, st.size);
        });
      });
    });
  });
}

function startServer() {
  const server = http.createServer((req, res) => {
    const deny = (code) => { if (!res.headersSent) res.writeHead(code); res.end(); };
    try {
      handle(req, res, deny);
    } catch (err) { // a request must never take the driver (and a predict in flight) down
      log(`browser: file server: ${req.method} ${JSON.stringify(req.url)} failed: ${err && err.message}`);
      deny(500);
    }
  });

  function handle(req, res, deny) {
    if (req.method !== 'GET') return deny(405);
    // Only this server's own origin (no DNS rebinding: the Host header must be the loopback address).
    if (req.headers.host !== `127.0.0.1:${server.address().port}`) return deny(403);
    let parts;
    try {
      parts = decodeURIComponent(String(req.url).split('?')[0]).split('/').filter(Boolean);
    } catch (err) { // a malformed escape (GET /%E0%A4%A): URIError
      return deny(400);
    }
    const send = (file, type) => fs.readFile(file, (err, data) => {
      if (err) return deny(404);
      res.writeHead(200, { 'Content-Type': type, 'Cache-Control': 'no-store' });
      res.end(data);
    });
    if (parts.length === 1 && PAGE_FILES[parts[0]]) return send(path.join(__dirname, parts[0]), PAGE_FILES[parts[0]]);
    if (parts.length === 2 && parts[0] === 'lib' && BUNDLES[parts[1]]) return send(bundlePath(parts[1]), 'text/javascript');
    if (!(parts.length >= 3 && parts[0] === 'm' && models.has(parts[1]))) return deny(404);
    // Only the files this model's manifest names, each checked now (it may have changed since load).
    const entry = models.get(parts[1]);
    const rel = parts.slice(2).join('/');
    if (!entry.files.has(rel)) return deny(404);
    openModelFile(entry, rel, (why, fd, size) => {
      if (why) {
        entry.refused.push(why);
        log(`browser: file server refused ${why}`);
        return deny(403);
      }
      res.writeHead(200, { 'Content-Type': rel === 'model.json' ? 'application/json' : 'application/octet-stream',
        'Content-Length': size, 'Cache-Control': 'no-store' });
      const stream = fs.createReadStream(null, { fd, autoClose: true });
      stream.on('error', () => res.destroy());
      stream.pipe(res);
    });
  }

  server.maxConnections = 64;
  return new Promise((resolve, reject) => {
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => resolve(server));
  });
}

// Where Chromium's requests for anything but this machine end: a loopback port that closes each
// connection (--proxy-server). Ours, so no other process can be listening there. What was asked
// goes to stderr (the tail Python keeps), e.g. "CONNECT accounts.google.com:443".
// The first 10 only: that tail also carries Chromium's last words when it dies.
function startSink() {
  let told = 0;
  const sink = net.createServer((socket) => {
    socket.once('data', (d) => {
      if (++told <= 10) log(`browser: refused Chromium's request ${JSON.stringify(String(d).split('\r\n')[0].slice(0, 200))}`);
    });
    socket.on('error', () => {});
    setTimeout(() => socket.destroy(), 50);
  });
  return new Promise((resolve, reject) => {
    sink.on('error', reject);
    sink.listen(0, '127.0.0.1', () => resolve(sink));
  });
}

// A page's paused request, answered from the static server by this process: the server's checks
// (its origin, the model's token, each file as it is now) decide, its status and bytes go back as
// they are. Anything not addressed to the server (another origin, another method) fails in the
// page, as a blocked request, without leaving Chromium.
function relayFetch(cdp, base, sessionId, params) {
  const { requestId, request } = params;
  const answer = (method, extra) => cdp.send(method, Object.assign({ requestId }, extra), sessionId).catch(() => {
    // the page closed meanwhile: nothing waits for the answer
  });
  const blocked = () => answer('Fetch.failRequest', { errorReason: 'BlockedByClient' });
  const url = String(request.url);
  if (request.method !== 'GET' || !url.startsWith(`${base}/`)) return blocked();
  const { hostname, port } = new URL(base);
  const get = http.get({ host: hostname, port, path: url.slice(base.length), agent: false,
    headers: { Host: `${hostname}:${port}` } }, (res) => {
    const chunks = [];
    res.on('data', (c) => chunks.push(c));
    res.on('error', blocked);
    res.on('end', () => {
      const headers = [];
      if (res.headers['content-type']) headers.push({ name: 'Content-Type', value: res.headers['content-type'] });
      headers.push({ name: 'Cache-Control', value: 'no-store' });
      answer('Fetch.fulfillRequest', { responseCode: res.statusCode, responseHeaders: headers,
        body: Buffer.concat(chunks).toString('base64') });
    });
  });
  get.on('error', blocked);
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
    } else if (msg.method === 'Fetch.requestPaused' && msg.sessionId) {
      if (this.onPaused) this.onPaused(msg.sessionId, msg.params);
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

// The session's folder and what goes in it. Python makes the folder (named so that a later session
// sweeps it once its owner is gone); run alone, this script makes its own.
const SESSION_DIR = process.env.MODELPARITY_BROWSER_DIR || fs.mkdtempSync(path.join(os.tmpdir(), 'modelparity-browser-'));
const LEADS_GROUP = process.env.MODELPARITY_BROWSER_GROUP === '1';

// Chromium phones home despite --disable-background-networking (update.googleapis.com,
// clients2.google.com, the DNS resolver, a DNS-over-HTTPS server): each of these stops a part of
// that, and the last three stop whatever is left (no name resolves but localhost; a request for
// any other host goes to the sink). The pages' own requests never get this far: relayFetch.
function chromiumFlags(dir, sinkPort) {
  return ['--headless=new', '--no-sandbox', '--use-angle=swiftshader', '--enable-unsafe-swiftshader',
    '--remote-debugging-pipe', '--no-first-run', '--no-default-browser-check', '--disable-extensions',
    '--disable-background-networking', '--disable-sync', '--disable-component-update', '--disable-default-apps',
    '--disable-domain-reliability', '--disable-client-side-phishing-detection', '--no-pings',
    '--metrics-recording-only', '--disable-field-trial-config', '--no-service-autorun',
    '--safebrowsing-disable-auto-update', '--password-store=basic', '--use-mock-keychain',
    '--disable-breakpad', '--disable-crash-reporter', `--crash-dumps-dir=${path.join(dir, 'crash')}`,
    '--dns-prefetch-disable',
    '--disable-features=DnsOverHttps,AsyncDns,NetworkTimeServiceQuerying,OptimizationHints,MediaRouter,'
      + 'DialMediaRouteProvider,Translate,AutofillServerCommunication,CertificateTransparencyComponentUpdater,'
      + 'InterestFeedContentSuggestions,PrivacySandboxSettings4,PreconnectToSearch,AimEnabled',
    // Google's own endpoints (sign-in, search preconnect, push messaging's check-in) point at the
    // sink: without these, one page and a predict asked the proxy for www.google.com (x4),
    // accounts.google.com (x3) and android.clients.google.com.
    ...['gaia-url', 'google-apis-url', 'lso-url', 'google-base-url', 'gcm-checkin-url', 'gcm-mcs-endpoint',
      'gcm-registration-url'].map((name) => `--${name}=http://127.0.0.1:${sinkPort}`),
    '--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1',
    `--proxy-server=http://127.0.0.1:${sinkPort}`,
    '--mute-audio', '--disable-dev-shm-usage', `--user-data-dir=${path.join(dir, 'profile')}`];
}

let chromium = null; // the running browser's ChildProcess
let stopping = false;

// Python removes the folder too; this is for when Python is gone (its death signal, stdin EOF).
function removeSessionDir() {
  try { fs.rmSync(SESSION_DIR, { recursive: true, force: true }); } catch (err) { /* Python or a sweep retries */ }
}

// Every way out: stop Chromium (and, leading the group, whatever it left), empty the session folder.
async function stop(code) {
  if (stopping) return;
  stopping = true;
  if (chromium && chromium.exitCode === null && chromium.signalCode === null) {
    const gone = new Promise((resolve) => { chromium.once('exit', resolve); setTimeout(resolve, 2000); });
    try { chromium.kill('SIGKILL'); } catch (err) { /* already gone */ }
    await gone;
  }
  removeSessionDir();
  // Python gone or done (code 0): take down whatever Chromium left in this group, this process
  // too. Otherwise Python, alive, reads the exit code and kills the group itself.
  if (LEADS_GROUP && code === 0) try { process.kill(-process.pid, 'SIGKILL'); } catch (err) { /* not a leader */ }
  process.exit(code);
}
process.on('SIGTERM', () => stop(0));
process.on('SIGHUP', () => stop(0));
process.on('exit', () => { // a crash of this script: at least no browser and no profile left
  if (chromium && chromium.exitCode === null) try { chromium.kill('SIGKILL'); } catch (err) { /* gone */ }
  if (!stopping) removeSessionDir();
});

async function launch(executable, sinkPort) {
  const dir = SESSION_DIR;
  const home = path.join(dir, 'home');
  for (const sub of ['profile', 'home', 't', 'crash']) fs.mkdirSync(path.join(dir, sub), { recursive: true, mode: 0o700 });
  const extra = (process.env.MODELPARITY_CHROMIUM_FLAGS || '').split(/\s+/).filter(Boolean);
  const args = [...chromiumFlags(dir, sinkPort), ...extra, 'about:blank'];
  // Nothing under the user's own $HOME: Chromium writes ~/.config/chromium/Crash Reports and ~/.pki
  // whatever --user-data-dir says.
  const env = Object.assign({}, process.env, { HOME: home, XDG_CONFIG_HOME: path.join(home, '.config'),
    XDG_CACHE_HOME: path.join(home, '.cache'), XDG_DATA_HOME: path.join(home, '.local', 'share'),
    XDG_STATE_HOME: path.join(home, '.local', 'state'), TMPDIR: path.join(dir, 't'), // short: Chromium's singleton socket goes there
    BREAKPAD_DUMP_LOCATION: path.join(dir, 'crash') });
  const proc = spawn(executable, args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'], env });
  chromium = proc;
  const tail = [];
  proc.stderr.on('data', (d) => {
    for (const line of String(d).split('\n')) if (line.trim()) { tail.push(line); if (tail.length > 20) tail.shift(); }
  });
  const stderrDone = new Promise((resolve) => { proc.stderr.on('close', resolve); proc.stderr.on('error', resolve); });
  // Writes to a browser that died fail with EPIPE: its exit says why, not node's stack.
  for (const fd of [3, 4]) proc.stdio[fd].on('error', () => {});
  let started = false;
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  exited.then(async ({ code, signal }) => {
    if (stopping || !started) return;
    await Promise.race([stderrDone, new Promise((r) => setTimeout(r, 500))]);
    log(`browser: Chromium exited (${signal ? `signal ${signal}` : `code ${code}`}); last lines:\n${tail.join('\n')}`);
    stop(3); // Python sees the process die and starts a new browser on its next call
  });
  await new Promise((resolve, reject) => {
    proc.on('error', (err) => reject(new Error(`cannot start ${executable}: ${err.message}`)));
    proc.on('spawn', resolve);
  });
  const cdp = new DevTools(proc);
  const died = exited.then(async ({ code, signal }) => {
    await Promise.race([stderrDone, new Promise((r) => setTimeout(r, 500))]);
    const said = tail.length ? `; its stderr:\n${tail.join('\n')}` : ' and printed nothing';
    throw new Error(`Chromium (${executable}) exited at start-up (${signal ? `signal ${signal}` : `code ${code}`})${said}`);
  });
  try {
    const version = await Promise.race([died, within(START_MS, cdp.send('Browser.getVersion'),
      `Chromium (${executable}) start-up`)]);
    started = true;
    return { proc, cdp, version };
  } catch (err) {
    proc.kill('SIGKILL'); // a browser that never answered must not outlive its failed start
    if (/did not finish within/.test(err.message)) {
      throw new Error(`Chromium (${executable}) hung: it started but did not answer the DevTools protocol within `
        + `${START_MS / 1000} s (MODELPARITY_BROWSER_START_S), so it was killed`);
    }
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
    const sink = await startSink();
    browser = await launch(executable, sink.address().port);
  } catch (err) {
    sendError(`cannot start the browser: ${err.message}`);
    return sendDrained(() => stop(1));
  }
  const { cdp, version } = browser;
  const base = `http://127.0.0.1:${server.address().port}`;
  cdp.onPaused = (sessionId, params) => relayFetch(cdp, base, sessionId, params);
  sendJSON('H', { chromium: version.product, user_agent: version.userAgent, protocol: version.protocolVersion,
    server: base });

  const pages = new Map(); // page id -> {targetId, sessionId, token}
  let nextPage = 0;

  async function openPage(frame) {
    const req = JSON.parse(frame.toString('utf8', 1));
    const token = crypto.randomBytes(12).toString('hex');
    const dir = path.dirname(req.model);
    const entry = { dir, realDir: fs.realpathSync(dir), files: new Set(['model.json', ...req.files]), refused: [] };
    models.set(token, entry);
    const { targetId } = await cdp.send('Target.createTarget', { url: 'about:blank' });
    let sessionId;
    try {
      ({ sessionId } = await cdp.send('Target.attachToTarget', { targetId, flatten: true }));
      await cdp.send('Inspector.enable', {}, sessionId);
      // every request of the page, the navigation included, is answered by relayFetch
      await cdp.send('Fetch.enable', { patterns: [{ urlPattern: '*', requestStage: 'Request' }] }, sessionId);
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
      sendJSON('H', Object.assign(meta, { page: id, model_url: opts.url }));
    } catch (err) {
      models.delete(token);
      await cdp.send('Target.closeTarget', { targetId }).catch(() => {});
      if (entry.refused.length) { // the page's own error only says a fetch failed
        throw new Error(`cannot load graph model ${req.model} in Chromium: the file server refused ${entry.refused.join('; ')}`);
      }
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

  serve({ L: ['load', openPage], P: ['predict', run], I: ['intermediates', run], C: ['close', closePage] }, stop);
}

main().catch((err) => {
  sendError(`browser driver crashed: ${err && err.stack ? err.stack : err}`);
  sendDrained(() => stop(1));
});
