// The binary frame protocol that runner.js (format "tfjs", Node.js) and browser.js (the
// tfjs:webgl/webgpu formats, headless Chromium) both speak with Python over stdin/stdout.
//
// Shared because Python reads both with one decoder (runtime/tfjs_process.py's NodeProcess; the
// browser's process is one too): the framing, the tensor encoding, the 'R' answer and the error
// frames must not drift apart between the two scripts. Each script's own header lists the
// messages it sends and answers; this module owns only what they have in common:
//
//   frame  := u32 LE payload length, payload; payload[0] is the message type (one latin-1 char)
//   tensor := u16 name length, name (UTF-8), u8 dtype (0 float32, 1 int32, 2 bool as u8),
//             u8 rank, rank x u32 dims, data bytes (product(dims) x itemsize, little-endian)
//   'R' + f64 compute ms + u8 mode + u16 count + tensors       an answer
//   'E' + UTF-8 message                                        an error
//   'I' fetch := u32 byte budget + u16 node count + (u16 length, UTF-8 node name) x count
//   'Q'                                                        quit (closing stdin does the same)
//
// Requiring it diverts process.stdout to stderr (see below), so it is required before anything
// that could print.
'use strict';

// stdout carries only protocol frames: everything else (tfjs's "install tfjs-node" banner,
// warnings, console.*) goes to stderr, which Python keeps as a tail for error messages. A library
// writing to process.stdout directly would corrupt the framing, so that goes to stderr too;
// frames are written with the original function.
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
  const payload = Buffer.concat([Buffer.from(type, 'latin1'), body || Buffer.alloc(0)]);
  const head = Buffer.alloc(4);
  head.writeUInt32LE(payload.length, 0);
  stdoutWrite(Buffer.concat([head, payload]));
}

const sendError = (message) => send('E', Buffer.from(String(message), 'utf8'));
const sendJSON = (type, obj) => send(type, Buffer.from(JSON.stringify(obj), 'utf8'));

// Calls `then` once what was sent has been written out (before an exit, so Python reads it all).
const sendDrained = (then) => stdoutWrite('', then);

function fail(message) {
  sendError(message);
  sendDrained(() => process.exit(1));
}

// Reads the u16 count + tensors at `offset`, calling make(name, dtype, shape, bytes) for each
// (bytes: a view into `buf`, possibly not 4-byte aligned) and returning what it returned, in order.
// Buffer.read* throw on reads past the end; data and trailing bytes are checked here.
function decodeTensors(buf, offset, make) {
  const count = buf.readUInt16LE(offset);
  offset += 2;
  const out = [];
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
    out.push(make(name, dtype, shape, buf.subarray(offset, offset + nbytes)));
    offset += nbytes;
  }
  if (offset !== buf.length) throw new Error(`malformed frame: ${buf.length - offset} bytes after the last tensor`);
  return out;
}

// One tensor of an answer; `data` is its raw little-endian bytes (a Buffer).
function encodeTensor(name, dtype, shape, data) {
  const code = DTYPES.indexOf(dtype);
  if (code < 0) throw new Error(`output ${name} has dtype ${dtype}, which the runner cannot send`);
  const nameBytes = Buffer.from(name, 'utf8');
  const head = Buffer.alloc(2 + nameBytes.length + 2 + 4 * shape.length);
  let o = head.writeUInt16LE(nameBytes.length, 0);
  o += nameBytes.copy(head, o);
  o = head.writeUInt8(code, o);
  o = head.writeUInt8(shape.length, o);
  for (const d of shape) o = head.writeUInt32LE(d, o);
  return Buffer.concat([head, data]);
}

// The 'R' frame: compute time, mode (0 model.execute, 1 model.executeAsync), encoded tensors.
function sendAnswer(ms, mode, tensors) {
  const head = Buffer.alloc(11);
  head.writeDoubleLE(ms, 0);
  head.writeUInt8(mode, 8);
  head.writeUInt16LE(tensors.length, 9);
  send('R', Buffer.concat([head, ...tensors]));
}

// The fetch part of an 'I' frame at `offset`: {budget, names, offset (where the tensors start)}.
function decodeFetch(buf, offset) {
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
  return { budget, names, offset };
}

// Reads frames from stdin and runs handlers[type] = [what, fn(frame)] on each, one at a time in
// arrival order; a handler's error is answered with 'E' "<what> failed: <message>" and serving goes
// on. 'Q', or stdin closing (Python gone: exit, crash, kill), exits once the queue is done: the
// script must not outlive Python.
//
// `stop` (optional) runs before every exit of serve's: an async clean-up (browser.js stops
// Chromium and removes its profile there) that gets the exit code and exits itself.
function serve(handlers, stop = (code) => process.exit(code)) {
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
      const handler = Object.prototype.hasOwnProperty.call(handlers, type) ? handlers[type] : null;
      if (type === 'Q') queue = queue.then(() => stop(0));
      else if (!handler) queue = queue.then(() => sendError(`unknown message type ${JSON.stringify(type)}`));
      else queue = queue.then(() => handler[1](frame)).catch((err) => sendError(`${handler[0]} failed: ${err.message}`));
    }
  });
  process.stdin.on('end', () => queue.then(() => stop(0), () => stop(0)));
  process.stdin.on('error', () => stop(0));
  process.stdout.on('error', () => stop(0));
}

module.exports = {
  DTYPES, ITEMSIZE, log, send, sendError, sendDrained, sendJSON, fail, decodeTensors, encodeTensor, sendAnswer, decodeFetch,
  serve,
};
