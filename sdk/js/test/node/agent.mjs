// AgentClient against the real relay and the Go echo runtime (driven by
// e2e/agent_node_test.go, which talks with this script in lines: we print
// "STEP <name>" and wait for the Go side's answer on stdin). Env: AGENT
// (the agent listener's https origin; NODE_EXTRA_CA_CERTS trusts its
// development CA), INSTANCE and TOKEN (an instance of account A and A's
// client token), OTHER_INSTANCE (an instance of account B).
import assert from "node:assert/strict";
import { createInterface } from "node:readline";
import { AgentClient, AgentError } from "../../dist/agent.js";
import { SocketClosedError } from "../../dist/errors.js";

const { AGENT, INSTANCE, TOKEN, OTHER_INSTANCE } = process.env;
assert.ok(AGENT && INSTANCE && TOKEN && OTHER_INSTANCE, "AGENT, INSTANCE, TOKEN, OTHER_INSTANCE");

const stdin = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
/** Tells the Go side we reached step and waits for its answer line. */
async function step(name) {
  console.log(`STEP ${name}`);
  const { value, done } = await stdin.next();
  assert.ok(!done, `stdin closed at step ${name}`);
  assert.equal(value, `ok ${name}`);
}

async function until(cond, what, ms = 20_000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const client = new AgentClient({ relay: AGENT, instance: INSTANCE, token: TOKEN });
const states = [];
client.onstate = (s) => states.push(s);
await client.connect();
assert.equal(client.state, "open");

// A round trip whose payload JSON.stringify could not write: integers past
// 2^64, duplicate keys, unicode raw and escaped, nesting, odd spacing. The
// echo carries the payload's bytes; payloadRaw must be them exactly.
const payload = '{"big":123456789012345678901234567890,"neg":-0.000000000000000000001e-300,"d":1,"D":2,"d":{"x":[1,{"y":"é\\u00e9\\ud83d\\ude00 😀"}]} , "s":"a\\"b\\\\c\\n"}';
const echo = await client.request("ask.run", undefined, { payloadRaw: payload, timeoutMs: 10_000 });
assert.equal(echo.type, "echo");
assert.equal(echo.instance, INSTANCE);
assert.ok(echo.session, "the relay's session");
assert.equal(echo.payloadRaw, payload, "payload bytes changed on the way");
assert.equal(echo.payload.d.x[1].y, "éé😀 😀");
const firstSession = echo.session;

// An ordinary request: the echo's payload is what JSON.stringify wrote.
const plain = await client.request("ask.run", { q: "hi", n: [1, 2.5, null] });
assert.equal(plain.payloadRaw, '{"q":"hi","n":[1,2.5,null]}');
assert.equal(plain.session, firstSession);

// The relay acks our relay.heartbeat itself.
const ack = await client.request("relay.heartbeat", undefined, { timeoutMs: 5000 });
assert.equal(ack.type, "relay.ack");
assert.equal(ack.instance, INSTANCE);
assert.ok(ack.re);

// An unknown relay.* request is answered unsupported_type.
await assert.rejects(client.request("relay.nonsense"), (e) => e instanceof AgentError && e.code === "unsupported_type");

// Refused attaches: an unknown instance, another account's instance, a bad
// token. A browser sees only a failed socket (1006); none is retried.
for (const [instance, token] of [["no-such-instance", TOKEN], [OTHER_INSTANCE, TOKEN], [INSTANCE, "x".repeat(43)]]) {
  const c = new AgentClient({ relay: AGENT, instance, token });
  await assert.rejects(c.connect(), (e) => e instanceof SocketClosedError && e.code === 1006, `${instance} with ${token.slice(0, 4)}…`);
  assert.equal(c.state, "closed");
  assert.equal(c.attaches, 0);
}

// A second attachment of its own, closed: the runtime counts its detach.
const second = new AgentClient({ relay: AGENT, instance: INSTANCE, token: TOKEN });
await second.connect();
const e2 = await second.request("ask.run", 2);
assert.notEqual(e2.session, firstSession, "one session per attachment");
second.close();
await until(() => second.state === "closed", "second client closed");
await step("detach");

// The relay restarts (the Go side kills it and starts it again on the same
// ports, without the runtime): the client reattaches with backoff.
await step("restart");
await until(() => client.attaches === 2 && client.state === "open", "reattached after the relay restarted");
assert.ok(states.includes("connecting") && states.at(-1) === "open", `states ${states}`);
// Attached while the instance is offline: a request is answered unknown_instance.
await assert.rejects(client.request("ask.run", 3), (e) => e instanceof AgentError && e.code === "unknown_instance" && e.frame.type === "relay.error");

// The runtime dials in again: forwarding resumes on the same attachment.
await step("runtime");
const back = await client.request("ask.run", { after: "restart" });
assert.equal(back.payloadRaw, '{"after":"restart"}');
assert.notEqual(back.session, firstSession, "the reattachment is a new session");

client.close();
await until(() => client.state === "closed", "closed");
console.log("agent ok");
process.exit(0);
