// Scenario 4, CORS from the page's view: a page on an origin the relay
// does not list (OTHER_ORIGIN) cannot read any answer of the mailbox or of
// the agent listener's pair/redeem: fetch rejects with TypeError, and a
// request that needs a preflight is never sent (the same claim and the
// same pairing key then succeed from the listed origin, so the relay
// never saw the unlisted page's). The listed page (PAGE_ORIGIN) reads
// statuses, JSON error bodies and the exposed X-Relay-* headers.

import { launch, openPage, call, eq, ok, need, log } from "../lib.mjs";

export async function run() {
  const page = need("PAGE_ORIGIN"), other = need("OTHER_ORIGIN"), relay = need("RELAY_ORIGIN");
  const agent = need("AGENT_ORIGIN");
  const [pairKey] = need("PAIR_KEYS").split(",");
  const b = await launch([`--ignore-certificate-errors-spki-list=${need("AGENT_SPKI")}`]);
  try {
    const listed = await openPage(b.context, "listed", `${page}/test/browser/pages/cors.html`);
    const unlisted = await openPage(b.context, "unlisted", `${other}/test/browser/pages/cors.html`);
    eq(await call(listed, "origin"), page, "listed page's origin");
    eq(await call(unlisted, "origin"), other, "unlisted page's origin");
    ok(page !== relay && other !== relay, `a page shares the relay's origin ${relay}`);

    const x = await call(unlisted, "newLink");
    const mbox = `${relay}/v1/demo/mailbox/${x.id}`;
    const claim = { method: "PUT", headers: { Authorization: `Bearer ${x.token}` } };

    // Unlisted: a preflighted claim and a simple GET both reject.
    const refusedClaim = await call(unlisted, "probe", [mbox, claim]);
    eq([refusedClaim.ok, refusedClaim.name], [false, "TypeError"], "claim from the unlisted origin");
    const refusedGet = await call(unlisted, "probe", [`${mbox}/p2c`]);
    eq([refusedGet.ok, refusedGet.name], [false, "TypeError"], "simple GET from the unlisted origin");

    // Listed: the same claim creates the mailbox (201): the unlisted
    // page's PUT never reached the relay. Then 204, the HEAD's exposed
    // headers, and a 401's JSON body.
    const created = await call(listed, "probe", [mbox, claim]);
    eq([created.ok, created.status], [true, 201], "claim from the listed origin");
    const owned = await call(listed, "probe", [mbox, claim]);
    eq([owned.ok, owned.status], [true, 204], "second claim from the listed origin");
    const head = await call(listed, "probe", [`${mbox}/p2c`, { method: "HEAD", headers: claim.headers }]);
    eq([head.status, head.headers["x-relay-first"], head.headers["x-relay-last"], head.headers["x-relay-count"]],
      [200, "0", "0", "0"], "HEAD p2c from the listed origin (exposed headers)");
    const anon = await call(listed, "probe", [`${mbox}/p2c`]);
    eq([anon.status, anon.headers["content-type"], JSON.parse(anon.body)],
      [401, "application/json", { error: "unauthorized", status: 401 }], "GET without a bearer from the listed origin");

    // The agent listener's redeem (TLS; Chromium trusts its key by the SPKI pin).
    const redeem = {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ key: pairKey, instance_name: "browser-cors" }),
    };
    const refusedRedeem = await call(unlisted, "probe", [`${agent}/v1/pair/redeem`, redeem]);
    eq([refusedRedeem.ok, refusedRedeem.name], [false, "TypeError"], "redeem from the unlisted origin");
    const paired = await call(listed, "probe", [`${agent}/v1/pair/redeem`, redeem]);
    ok(paired.ok && paired.status === 200, `redeem from the listed origin: ${JSON.stringify(paired)}`);
    const body = JSON.parse(paired.body);
    ok(/^inst-/.test(body.instance_id) && body.instance_token.length >= 16 && body.relay_public_key.length === 44,
      `redeem answer: ${paired.body}`);
    const again = await call(listed, "probe", [`${agent}/v1/pair/redeem`, redeem]);
    eq([again.status, JSON.parse(again.body)], [403, { error: { message: "pairing key already used" } }], "second redeem of the key");
    log(`cors: unlisted ${other} refused (${refusedClaim.message}), listed ${page} read every answer`);
  } finally {
    await b.close();
  }
}
