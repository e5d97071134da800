// AgentClient against a fake attach endpoint (a fake WebSocket class): the
// URL and subprotocols, request/response by id with the payload's raw text,
// relay.error as AgentError, timeouts, heartbeats acked and unacked,
// refused attaches, reattaching with backoff after a drop, close(). The
// real relay and runtime: test/node/agent.mjs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { AgentClient, AgentError, AgentTimeoutError, CLOSE_HEARTBEAT_TIMEOUT } from "../../dist/agent.js";
import { parseAgentFrame } from "../../dist/agentframe.js";
import { SocketClosedError } from "../../dist/errors.js";

const later = (f) => setTimeout(f, 0);

async function until(cond, what, ms = 3000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

const INSTANCE = "inst-1";
const TOKEN = "client-token-0123456789";

/**
 * The relay's attach endpoint and an echo runtime behind it: a cargo
 * request is answered with {"type":"echo","instance","session","re","payload":<raw>},
 * relay.heartbeat with relay.ack (unless ackHeartbeats is false).
 */
class FakeAgentRelay {
  constructor() {
    this.sockets = [];
    this.dials = 0;
    this.received = []; // lines from clients
    this.ackHeartbeats = true;
    this.online = true;
    this.up = true;
    const relay = this;
    this.WebSocket = class FakeWS {
      constructor(url, protocols) {
        this.url = url;
        this.protocols = protocols;
        this.readyState = 0;
        this.onopen = this.onmessage = this.onclose = this.onerror = null;
        relay.dials++;
        later(() => relay.accept(this));
      }
      send(data) {
        if (this.readyState !== 1) throw new Error("fake ws: send while not open");
        relay.fromClient(this, data);
      }
      close(code = 1005, reason = "") {
        if (this.readyState >= 2) return;
        this.readyState = 2;
        this.closedWith = [code, reason];
        later(() => relay.drop(this, code, reason));
      }
    };
  }
  accept(ws) {
    const ok = this.up && ws.url === `wss://agent.test/v1/attach/${INSTANCE}` &&
      ws.protocols.length === 2 && ws.protocols[0] === "contenox-relay.v1" && ws.protocols[1] === `bearer.${TOKEN}`;
    if (!ok) {
      ws.readyState = 3;
      ws.onerror?.({});
      ws.onclose?.({ code: 1006, reason: "" });
      return;
    }
    ws.session = `s${this.sockets.length + 1}`;
    this.sockets.push(ws);
    ws.readyState = 1;
    ws.onopen?.({});
  }
  toClient(ws, line) {
    later(() => ws.readyState === 1 && ws.onmessage?.({ data: line }));
  }
  fromClient(ws, line) {
    assert.equal(typeof line, "string");
    assert.ok(!/[\r\n]/.test(line), "one line");
    this.received.push(line);
    const f = parseAgentFrame(line);
    if (f.type === "relay.heartbeat") {
      if (this.ackHeartbeats && f.id) this.toClient(ws, JSON.stringify({ type: "relay.ack", instance: INSTANCE, re: f.id }));
      return;
    }
    if (!f.id) return;
    if (!this.online) {
      this.toClient(ws, JSON.stringify({ type: "relay.error", instance: INSTANCE, session: ws.session, re: f.id, payload: { code: "unknown_instance", message: "instance offline" } }));
      return;
    }
    if (f.type === "silent") return;
    const payload = f.payloadRaw === undefined ? "" : `,"payload":${f.payloadRaw}`;
    this.toClient(ws, `{"type":"echo","instance":"${INSTANCE}","session":"${ws.session}","re":${JSON.stringify(f.id)}${payload}}`);
  }
  /** The relay closes ws (or completes the client's own close). */
  drop(ws, code, reason) {
    if (ws.readyState === 3) return;
    ws.readyState = 3;
    later(() => ws.onclose?.({ code, reason }));
  }
  get live() {
    return this.sockets.filter((s) => s.readyState === 1);
  }
}

function client(relay, extra = {}) {
  return new AgentClient({ relay: "https://agent.test", instance: INSTANCE, token: TOKEN, WebSocket: relay.WebSocket, heartbeatMs: 0, ...extra });
}

test("request/response by id; the payload's raw text byte for byte; other frames to onframe", async () => {
  const relay = new FakeAgentRelay();
  const c = client(relay);
  const states = [];
  c.onstate = (s) => states.push(s);
  await c.connect();
  assert.deepEqual(states, ["connecting", "open"]);
  assert.equal(c.state, "open");
  assert.equal(c.attaches, 1);

  const f = await c.request("ask.run", { q: "hi", n: [1, 2] });
  assert.equal(f.type, "echo");
  assert.equal(f.session, "s1");
  assert.equal(f.payloadRaw, '{"q":"hi","n":[1,2]}');
  assert.deepEqual(f.payload, { q: "hi", n: [1, 2] });
  const sent = parseAgentFrame(relay.received.at(-1));
  assert.equal(sent.type, "ask.run");
  assert.equal(f.re, sent.id);

  // A string frame goes as it is: big numbers and duplicates survive.
  const raw = '{"type":"ask.raw","id":"mine","payload":{"big":123456789012345678901234567890,"d":1,"d":2}}';
  const echoed = new Promise((r) => (c.onframe = r));
  c.send(raw);
  assert.equal(relay.received.at(-1), raw);
  const e = await echoed; // not a request() of ours: onframe
  assert.equal(e.re, "mine");
  assert.equal(e.payloadRaw, '{"big":123456789012345678901234567890,"d":1,"d":2}');

  // payloadRaw: the payload's text as given; a bad one is refused unsent.
  const rawPayload = '{ "big": 123456789012345678901234567890, "d":1, "d":[2] }';
  const r = await c.request("ask.raw", undefined, { payloadRaw: rawPayload });
  assert.equal(r.payloadRaw, rawPayload);
  assert.ok(relay.received.at(-1).endsWith(`,"payload":${rawPayload}}`));
  const before = relay.received.length;
  await assert.rejects(c.request("x", undefined, { payloadRaw: "{" }), TypeError);
  await assert.rejects(c.request("x", undefined, { payloadRaw: "1\n" }), TypeError);
  await assert.rejects(c.request("x", 1, { payloadRaw: "1" }), TypeError);
  assert.equal(relay.received.length, before);

  // Ids are fresh per request.
  const [a, b] = await Promise.all([c.request("x"), c.request("x")]);
  assert.notEqual(a.re, b.re);
  assert.equal(a.payloadRaw, undefined);

  // A line that is not a frame is counted and dropped.
  const frames = [];
  c.onframe = (x) => frames.push(x);
  relay.toClient(relay.live[0], "not json");
  relay.toClient(relay.live[0], '{"type":"note"}');
  await until(() => frames.length === 1, "the note");
  assert.equal(c.malformed, 1);
  c.close();
  await until(() => c.state === "closed", "closed");
  assert.deepEqual(relay.sockets[0].closedWith, [1000, ""]);
});

test("relay.error rejects with AgentError; timeouts with AgentTimeoutError", async () => {
  const relay = new FakeAgentRelay();
  const c = client(relay);
  await c.connect();
  relay.online = false;
  await assert.rejects(c.request("ask.run", {}), (e) => e instanceof AgentError && e.code === "unknown_instance" && e.frame.type === "relay.error" && /instance offline/.test(e.message));
  relay.online = true;
  await assert.rejects(c.request("silent", null, { timeoutMs: 30 }), (e) => e instanceof AgentTimeoutError && e.timeoutMs === 30);
  // A late answer to a timed-out request is just a frame.
  assert.ok((await c.request("after")).re);
  c.close();
});

test("send refuses what would not be one JSON object on one line, and sends nothing when detached", async () => {
  const relay = new FakeAgentRelay();
  const c = client(relay);
  assert.throws(() => c.send({ type: "x" }), SocketClosedError);
  await assert.rejects(c.request("x"), SocketClosedError);
  await c.connect();
  for (const bad of ['{"type":"a"}\n', '{"type":"a",\r"x":1}', "[1]", "null", "{", '{"type":"a"} {"type":"b"}']) {
    assert.throws(() => c.send(bad), TypeError, JSON.stringify(bad));
  }
  assert.throws(() => c.send({ type: "" }), TypeError);
  assert.throws(() => c.send({}), TypeError);
  // JSON.stringify escapes a line feed inside a string: still one line.
  c.send({ type: "t", text: "a\nb" });
  assert.equal(relay.received.at(-1), '{"type":"t","text":"a\\nb"}');
  assert.equal(relay.received.length, 1);
  c.close();
});

test("a refused attach rejects with SocketClosedError 1006 and is not retried", async () => {
  const relay = new FakeAgentRelay();
  const c = new AgentClient({ relay: "https://agent.test", instance: "someone-elses", token: TOKEN, WebSocket: relay.WebSocket });
  await assert.rejects(c.connect(), (e) => e instanceof SocketClosedError && e.code === 1006);
  assert.equal(c.state, "closed");
  await new Promise((r) => setTimeout(r, 400)); // longer than the first backoff
  assert.equal(relay.dials, 1);
  assert.throws(() => new AgentClient({ relay: "https://agent.test", instance: "", token: TOKEN }), TypeError);
});

test("after a drop: pending requests reject, the client reattaches with backoff until the relay is back", async () => {
  const relay = new FakeAgentRelay();
  const c = client(relay);
  const states = [];
  c.onstate = (s) => states.push(s);
  await c.connect();
  const pending = c.request("silent");
  relay.up = false; // the relay is gone: reattaches fail for a while
  relay.drop(relay.live[0], 1006, "");
  await assert.rejects(pending, (e) => e instanceof SocketClosedError && e.code === 1006);
  await until(() => relay.dials >= 3, "two failed reattaches");
  assert.notEqual(c.state, "open");
  relay.up = true;
  await until(() => c.state === "open", "reattached", 5000);
  assert.equal(c.attaches, 2);
  assert.deepEqual(states.slice(0, 4), ["connecting", "open", "closed", "connecting"]);
  assert.equal(states.at(-1), "open");
  const f = await c.request("again", 1);
  assert.equal(f.session, "s2"); // a new attachment, a new session
  c.close();
  await until(() => c.state === "closed", "closed");
  const dials = relay.dials;
  await new Promise((r) => setTimeout(r, 400));
  assert.equal(relay.dials, dials, "no reattach after close()");
});

test("reconnect: false stays closed after a drop", async () => {
  const relay = new FakeAgentRelay();
  const c = client(relay, { reconnect: false });
  await c.connect();
  relay.drop(relay.live[0], 1001, "going away");
  await until(() => c.state === "closed", "closed");
  await new Promise((r) => setTimeout(r, 400));
  assert.equal(relay.dials, 1);
});

test("heartbeats: acked ones are swallowed; an unacked one closes the socket (4001) and the client reattaches", async () => {
  const relay = new FakeAgentRelay();
  const c = client(relay, { heartbeatMs: 40 });
  const frames = [];
  c.onframe = (f) => frames.push(f);
  await c.connect();
  await until(() => relay.received.filter((l) => l.includes('"relay.heartbeat"')).length >= 3, "three heartbeats");
  const hb = parseAgentFrame(relay.received[0]);
  assert.equal(hb.type, "relay.heartbeat");
  assert.ok(hb.id);
  assert.equal(c.state, "open");
  assert.deepEqual(frames, [], "acks do not reach onframe");
  relay.ackHeartbeats = false;
  await until(() => relay.sockets[0].closedWith, "the client gave up on the silent socket");
  assert.deepEqual(relay.sockets[0].closedWith, [CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout"]);
  relay.ackHeartbeats = true;
  await until(() => c.attaches === 2 && c.state === "open", "reattached", 5000);
  c.close();
});
