// A browser client of an agent instance: run.mjs attaches it with
// AgentClient (scenarios/agent.mjs) to the Go echo runtime and compares
// what comes back with what went out.
import { AgentClient, AgentError } from "/dist/agent.js";

let client;
const states = [];
const frames = [];

/** The fields of a frame run.mjs compares (JSON-safe). */
const view = (f) => ({ type: f.type, instance: f.instance, session: f.session, re: f.re, payloadRaw: f.payloadRaw, raw: f.raw });

window.T = {
  origin: () => location.origin,
  async connect(relay, instance, token) {
    client = new AgentClient({ relay, instance, token, reconnect: false });
    client.onstate = (s) => states.push(s);
    client.onframe = (f) => frames.push(view(f));
    await client.connect();
    return states.slice();
  },
  /** request(); resolves with the answer, or with {error: {name, code}} for an AgentError. */
  async request(type, payload) {
    try {
      return view(await client.request(type, payload, { timeoutMs: 15_000 }));
    } catch (e) {
      if (e instanceof AgentError) return { error: { name: e.name, code: e.code, type: e.frame.type } };
      throw e;
    }
  },
  /**
   * A request of payloadBytes random base64 characters (the payload a
   * JSON string); returns the answer's payloadRaw length and whether it
   * equals what went out, not the megabytes themselves.
   */
  async bigRequest(payloadBytes) {
    const raw = new Uint8Array((payloadBytes * 3) / 4);
    for (let i = 0; i < raw.length; i += 65536) crypto.getRandomValues(raw.subarray(i, i + 65536));
    let s = "";
    for (let i = 0; i < raw.length; i += 8192) s += String.fromCharCode(...raw.subarray(i, i + 8192));
    const payload = btoa(s);
    const f = await client.request("ask", payload, { timeoutMs: 30_000 });
    return { sent: JSON.stringify(payload).length, got: f.payloadRaw.length, equal: f.payloadRaw === JSON.stringify(payload) };
  },
  /** send() of a line as is. */
  sendLine(line) {
    client.send(line);
  },
  /** Waits (at most ms) for a frame with re = re and returns it. */
  async frameFor(re, ms) {
    const until = Date.now() + ms;
    for (;;) {
      const f = frames.find((x) => x.re === re);
      if (f) return f;
      if (Date.now() > until) throw new Error(`no frame with re ${re} within ${ms} ms (${frames.length} frames)`);
      await new Promise((r) => setTimeout(r, 20));
    }
  },
  states: () => states.slice(),
  close() {
    client.close();
  },
};
