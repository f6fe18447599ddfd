// socket.mq browser client: one ES module, no build step.
//
//   import { request, connect } from "/socket.mq/socketmq.js";
//   const reply = await request("echo", "hello", "hi");          // POST /socket.mq/echo/hello
//   const mq = await connect();                                  // WebSocket /socket.mq/ws
//   await mq.subscribe("demo/chat", (ev) => console.log(ev.from, ev.data));
//   await mq.publish("demo/chat", "hello");                      // string: text, bytes: binary
//
// Wire format: subprotocol socketmq.v1 (docs/socketmq.md).  A text message is one JSON object;
// a binary message is a JSON header, one LF byte, then the payload bytes.  OpenPGP is not used
// here on purpose: the draft warns that a key kept by a browser front end is easily stolen, so
// browsers authenticate per session at the back end (or with TLS client certificates).

export const SUBPROTOCOL = "socketmq.v1";
export const VERSION = 1;

export class SocketMQError extends Error {
  constructor(status, reason) {
    super(`${status} ${reason || ""}`.trim());
    this.name = "SocketMQError";
    this.status = status;
    this.reason = reason || "";
  }
}

function origin(base) {
  return base ? new URL(base, window.location.href).origin : window.location.origin;
}

// POST /socket.mq/<application>/<requestId>.  Resolves to {status, ok, headers, body (Uint8Array), text()}.
export async function request(application, requestId, body = "", options = {}) {
  const headers = { "Socket-MQ-Version": String(VERSION) };
  if (options.contentType) headers["Content-Type"] = options.contentType;
  if (options.interfaceVersion) headers["Interface-Version"] = String(options.interfaceVersion);
  const url = `${origin(options.base)}/socket.mq/${encodeURIComponent(application)}/${encodeURIComponent(requestId)}`;
  const response = await fetch(url, { method: "POST", headers, body });
  const bytes = new Uint8Array(await response.arrayBuffer());
  return {
    status: response.status,
    ok: response.ok,
    headers: response.headers,
    body: bytes,
    text: () => new TextDecoder().decode(bytes),
  };
}

function decode(data) {
  if (typeof data === "string") {
    const message = JSON.parse(data);
    return message;
  }
  const bytes = new Uint8Array(data);
  const end = bytes.indexOf(10);
  if (end < 0) throw new SocketMQError(1007, "binary message without a header");
  const message = JSON.parse(new TextDecoder().decode(bytes.subarray(0, end)));
  message.data = bytes.slice(end + 1);
  message.binary = true;
  return message;
}

function encode(message, payload) {
  if (payload === undefined || typeof payload === "string") {
    if (payload !== undefined) message.data = payload;
    return JSON.stringify(message);
  }
  const header = new TextEncoder().encode(JSON.stringify(message) + "\n");
  const bytes = payload instanceof ArrayBuffer ? new Uint8Array(payload) : new Uint8Array(payload.buffer, payload.byteOffset, payload.byteLength);
  const out = new Uint8Array(header.length + bytes.length);
  out.set(header, 0);
  out.set(bytes, header.length);
  return out;
}

// One socket.mq WebSocket.  Events for which no subscribe() callback exists go to `onevent`;
// `ondropped(count)` reports events the server dropped because this page read too slowly;
// `onclose(code, reason)` reports the end of the connection.
export class Connection {
  constructor(socket) {
    this.socket = socket;
    this.hello = null;
    this.identity = null;
    this.dropped = 0;
    this.onevent = null;
    this.ondropped = null;
    this.onclose = null;
    this._id = 0;
    this._calls = new Map();
    this._subscriptions = new Map();
    socket.binaryType = "arraybuffer";
    socket.addEventListener("message", (e) => this._receive(e.data));
    socket.addEventListener("close", (e) => {
      const error = new SocketMQError(e.code, e.reason || "connection closed");
      for (const call of this._calls.values()) call.reject(error);
      this._calls.clear();
      if (this.onclose) this.onclose(e.code, e.reason);
    });
  }

  _receive(data) {
    let message;
    try {
      message = decode(data);
    } catch (error) {
      this.socket.close(1007, "bad message");
      return;
    }
    switch (message.type) {
      case "hello":
        this.hello = message;
        if (this._ready) this._ready(this);
        break;
      case "result": {
        const call = this._calls.get(message.id);
        if (!call) break;
        this._calls.delete(message.id);
        if (message.status === 200) call.resolve(message);
        else call.reject(new SocketMQError(message.status, message.reason));
        break;
      }
      case "event": {
        const event = { event: message.event, data: message.data, binary: !!message.binary, from: message.from, protocol: message.protocol };
        const callback = this._subscriptions.get(message.event) || this.onevent;
        if (callback) callback(event);
        break;
      }
      case "dropped":
        this.dropped += message.count;
        if (this.ondropped) this.ondropped(message.count);
        break;
      default:
        break;
    }
  }

  // Send one request and resolve with its result (reject with SocketMQError unless 200).
  call(message, payload) {
    const id = ++this._id;
    message.id = id;
    return new Promise((resolve, reject) => {
      this._calls.set(id, { resolve, reject });
      this.socket.send(encode(message, payload));
    });
  }

  async subscribe(event, callback) {
    this._subscriptions.set(event, callback);
    try {
      return await this.call({ type: "subscribe", event });
    } catch (error) {
      this._subscriptions.delete(event);
      throw error;
    }
  }

  unsubscribe(event) {
    this._subscriptions.delete(event);
    return this.call({ type: "unsubscribe", event });
  }

  // A string is sent as text; an ArrayBuffer or typed array intact in a binary message.
  publish(event, data) {
    return this.call({ type: "publish", event }, data);
  }

  login(method, identity, secret) {
    const message = { type: "auth", method, identity };
    if (secret !== undefined) message.secret = secret;
    return this.call(message).then((result) => {
      this.identity = result.identity;
      return result;
    });
  }

  close(code = 1000, reason = "") {
    this.socket.close(code, reason);
  }
}

// Open the WebSocket (default: this page's server) and resolve once the server said hello.
export function connect(base) {
  const url = new URL("/socket.mq/ws", origin(base));
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const socket = new WebSocket(url.href, [SUBPROTOCOL]);
  const connection = new Connection(socket);
  return new Promise((resolve, reject) => {
    connection._ready = resolve;
    socket.addEventListener("close", (e) => reject(new SocketMQError(e.code, e.reason || "could not connect")));
  });
}
