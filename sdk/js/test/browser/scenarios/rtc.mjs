// Scenario 2: a relay-only data channel. Both pages connect() with
// relayOnly; each page's selected candidate pair is relay on both ends,
// its local candidate came from our TURN listener (the url's port is
// TURN_ADDR's), each side's remote candidate is the other's local one
// (the relayed addresses on our TURN server), and 2 MiB one way and 1 MiB
// the other arrive whole (same byte count and SHA-256).

import { launch, openPage, call, eq, ok, need, log, withTimeout } from "../lib.mjs";

const MiB = 1024 * 1024;

/**
 * The page's selected candidate pair once its state is "succeeded": the
 * data channel may open on a pair whose check the controlling side has not
 * marked succeeded yet, so this polls, for at most 10 s.
 */
async function succeededPair(page) {
  const until = Date.now() + 10_000;
  for (;;) {
    const p = await call(page, "selectedPair");
    if (p.state === "succeeded" || Date.now() > until) return p;
    await new Promise((r) => setTimeout(r, 50));
  }
}

export async function run() {
  const origin = need("PAGE_ORIGIN"), relay = need("RELAY_ORIGIN"), turn = need("TURN_ADDR");
  const [turnHost, turnPort] = [turn.slice(0, turn.lastIndexOf(":")), turn.slice(turn.lastIndexOf(":") + 1)];
  const b = await launch();
  try {
    const url = `${origin}/test/browser/pages/rtc.html`;
    const A = await openPage(b.context, "primary", url);
    const B = await openPage(b.context, "companion", url);
    await call(B, "fromCode", [await call(A, "generate")]);
    eq(await call(A, "claim", [relay, "primary"]), "created", "primary's claim");
    eq(await call(B, "claim", [relay, "companion"]), "owned", "companion's claim");

    const t0 = Date.now();
    const [ca, cb] = await withTimeout(Promise.all([
      call(A, "connect", [relay, "primary", true, 30_000], 40_000),
      call(B, "connect", [relay, "companion", true, 30_000], 40_000),
    ]), 45_000, "connect() in both pages");
    log(`rtc: data channel open after ${Date.now() - t0} ms`);
    eq([ca.readyState, ca.iceTransportPolicy, cb.readyState, cb.iceTransportPolicy], ["open", "relay", "open", "relay"], "channels (primary, companion)");
    eq(cb.label, ca.label, "companion's channel label");

    const pa = await succeededPair(A), pb = await succeededPair(B);
    log(`rtc: primary's pair ${JSON.stringify(pa)}; companion's ${JSON.stringify(pb)}`);
    for (const [who, p] of [["primary", pa], ["companion", pb]]) {
      eq([p.state, p.local.candidateType, p.remote.candidateType], ["succeeded", "relay", "relay"], `${who}'s selected pair (state, local, remote type)`);
      const u = new URL(p.local.url.replace(/^turns?:/, "turn://"));
      eq([u.hostname, u.port], [turnHost, turnPort], `${who}'s local relay candidate's TURN server (${p.local.url})`);
      eq(p.remote.address, turnHost, `${who}'s remote candidate's address (a relayed address of our TURN)`);
    }
    eq([pb.remote.address, pb.remote.port], [pa.local.address, pa.local.port], "companion's remote candidate = primary's local");
    eq([pa.remote.address, pa.remote.port], [pb.local.address, pb.local.port], "primary's remote candidate = companion's local");

    const t1 = Date.now();
    const [sa, sb] = await withTimeout(Promise.all([
      call(A, "sendRandom", [2 * MiB], 60_000),
      call(B, "sendRandom", [1 * MiB], 60_000),
    ]), 60_000, "send both ways");
    eq([sa.bytes, sb.bytes], [2 * MiB, 1 * MiB], "bytes sent (primary, companion)");
    const rb = await call(B, "received", [60_000], 65_000);
    const ra = await call(A, "received", [60_000], 65_000);
    eq([rb.ended, rb.bytes, rb.sha256, rb.messages], [true, sa.bytes, sa.sha256, 2 * MiB / 16384 + 1], "companion received the primary's bytes");
    eq([ra.ended, ra.bytes, ra.sha256, ra.messages], [true, sb.bytes, sb.sha256, 1 * MiB / 16384 + 1], "primary received the companion's bytes");
    log(`rtc: 3 MiB through TURN ${turn} in ${Date.now() - t1} ms`);
    await call(A, "close");
    await call(B, "close");
  } finally {
    await b.close();
  }
}
