// Scenario 3: a page attaches to an agent instance through the agent
// listener (wss with the development certificate, which Chromium trusts
// by its SPKI pin, nothing else) and AgentClient round-trips frames with
// the Go echo runtime: the echo names the page's request (re), the
// instance and the session the relay gave the attachment, and its
// payload's raw text equals what the page sent byte for byte, spacing,
// a number past 2^64 and duplicate keys included, and 1 MiB of payload.
// relay.heartbeat is acked by the relay; an unknown relay. request is
// refused with AgentError unsupported_type. The Go test then counts the
// echoes and the detach the close caused.

import { launch, openPage, call, eq, ok, need, log } from "../lib.mjs";

export async function run() {
  const origin = need("PAGE_ORIGIN"), agent = need("AGENT_ORIGIN");
  const instance = need("AGENT_INSTANCE"), token = need("AGENT_TOKEN");
  const b = await launch([`--ignore-certificate-errors-spki-list=${need("AGENT_SPKI")}`]);
  try {
    const P = await openPage(b.context, "client", `${origin}/test/browser/pages/agent.html`);
    ok(agent.startsWith("https://"), `agent origin ${agent} is not TLS`);
    eq(await call(P, "connect", [agent, instance, token]), ["connecting", "open"], "client states");

    const payload = { text: "h\u00e9llo \u2713", n: [1, 2, 3], nested: { ok: true } };
    const echo = await call(P, "request", ["ask", payload]);
    eq([echo.type, echo.instance, echo.payloadRaw], ["echo", instance, JSON.stringify(payload)], "echo of a request");
    ok(typeof echo.re === "string" && echo.re !== "" && typeof echo.session === "string" && echo.session !== "",
      `echo's re and session: ${JSON.stringify(echo)}`);

    // A line sent as is: the payload's text survives the relay and the
    // runtime byte for byte (no parse and re-encode anywhere).
    const odd = `{ "n": 12345678901234567890, "N": 1, "n": [1 ,2], "s":"\\u00e9" }`;
    await call(P, "sendLine", [`{"type":"ask","id":"raw-1","payload":${odd}}`]);
    const rawEcho = await call(P, "frameFor", ["raw-1", 15_000]);
    eq([rawEcho.type, rawEcho.session, rawEcho.payloadRaw], ["echo", echo.session, odd], "echo of a raw line");

    const big = await call(P, "bigRequest", [1024 * 1024], 40_000);
    eq(big, { sent: 1024 * 1024 + 2, got: 1024 * 1024 + 2, equal: true }, "echo of a 1 MiB payload");

    const ack = await call(P, "request", ["relay.heartbeat"]);
    eq([ack.type, ack.instance], ["relay.ack", instance], "relay.heartbeat's answer");
    const refused = await call(P, "request", ["relay.nope"]);
    eq(refused, { error: { name: "AgentError", code: "unsupported_type", type: "relay.error" } }, "an unknown relay. request");

    // close() ends the socket; the state turns "closed" on its close event.
    await call(P, "close");
    let states = await call(P, "states");
    for (const deadline = Date.now() + 10_000; states.at(-1) !== "closed" && Date.now() < deadline; ) {
      await new Promise((r) => setTimeout(r, 50));
      states = await call(P, "states");
    }
    eq(states.at(-1), "closed", "client's last state");
    log(`agent: attached to ${instance} through ${agent}, 3 echoes`);
  } finally {
    await b.close();
  }
}
