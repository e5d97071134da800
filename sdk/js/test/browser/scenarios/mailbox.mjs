// Scenario 1: two pages are the two devices of one link. Page A makes the
// link and hands its code to page B (as the QR code would); both claim the
// mailbox (created, then owned), each stores sealed envelopes for the
// other, then each watches its read direction and gets first the stored
// envelopes and then live ones, in order, exactly once, byte for byte.
// The relay holds only sealed bytes: an envelope read back raw is
// version 1, the sequence, and no plaintext.

import { launch, openPage, call, eq, ok, need, log } from "../lib.mjs";

const hexOf = (s) => Buffer.from(s, "utf8").toString("hex");
const allBytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i)).toString("hex");

export async function run() {
  const origin = need("PAGE_ORIGIN"), relay = need("RELAY_ORIGIN");
  const b = await launch();
  try {
    const url = `${origin}/test/browser/pages/mailbox.html`;
    const A = await openPage(b.context, "primary", url);
    const B = await openPage(b.context, "companion", url);
    eq(await call(A, "origin"), origin, "page origin");
    ok(origin !== relay, "the page is on the relay's origin");

    const made = await call(A, "generate");
    const taken = await call(B, "fromCode", [made.code]);
    eq(taken, { id: made.id, token: made.token }, "companion's link from the code");
    eq(await call(A, "mailbox", [relay, "primary"]), { id: made.id, writes: "p2c", reads: "c2p" }, "primary's mailbox");
    eq(await call(B, "mailbox", [relay, "companion"]), { id: made.id, writes: "c2p", reads: "p2c" }, "companion's mailbox");
    eq(await call(A, "claim"), "created", "primary's claim");
    eq(await call(B, "claim"), "owned", "companion's claim");

    // Stored before anyone watches.
    // (strings go as UTF-8; {hex} as those bytes: here all 256 values)
    const p2cSend = ["p2c stored 1", "p2c stored 2 \u00e9\u2713", { hex: allBytes }];
    const p2c = p2cSend.map((m) => (typeof m === "string" ? hexOf(m) : m.hex));
    const c2p = ["c2p stored 1", "c2p stored 2"].map(hexOf);
    const sent = [];
    for (const m of p2cSend) sent.push(await call(A, "send", [m]));
    eq(sent, [1, 2, 3], "primary's sequences");
    eq([await call(B, "send", ["c2p stored 1"]), await call(B, "send", ["c2p stored 2"])], [1, 2], "companion's sequences");

    // What the relay stores is sealed: 0x01, the sequence, ciphertext and tag.
    const raw = await call(A, "raw", ["p2c", 1]);
    eq(raw.length, 2 * (25 + "p2c stored 1".length), "stored envelope p2c/1's length");
    eq(raw.slice(0, 18), "010000000000000001", "stored envelope p2c/1's header");
    ok(!raw.includes(p2c[0]), "stored envelope p2c/1 holds its plaintext");

    const want = (hexes, from = 1) => hexes.map((hex, i) => ({ seq: from + i, hex }));
    await call(A, "watch");
    await call(B, "watch");
    let gotB = await call(B, "received", [3, 15_000]);
    eq(gotB.received, want(p2c), "companion's watch: the stored p2c envelopes");
    let gotA = await call(A, "received", [2, 15_000]);
    eq(gotA.received, want(c2p), "primary's watch: the stored c2p envelopes");

    // Live, while both watch.
    const p2cLive = ["p2c live 4", "p2c live 5"].map(hexOf);
    eq([await call(A, "send", ["p2c live 4"]), await call(A, "send", ["p2c live 5"])], [4, 5], "primary's live sequences");
    eq(await call(B, "send", ["c2p live 3"]), 3, "companion's live sequence");
    gotB = await call(B, "received", [5, 15_000]);
    eq(gotB.received, want(p2c.concat(p2cLive)), "companion's watch: stored then live, in order");
    gotA = await call(A, "received", [3, 15_000]);
    eq(gotA.received, want(c2p.concat([hexOf("c2p live 3")])), "primary's watch: stored then live, in order");
    // One more each way: a duplicate of anything earlier would have come before it.
    await call(A, "send", ["p2c live 6"]);
    await call(B, "send", ["c2p live 4"]);
    gotB = await call(B, "received", [6, 15_000]);
    gotA = await call(A, "received", [4, 15_000]);
    eq(gotB.received.map((m) => m.seq), [1, 2, 3, 4, 5, 6], "companion's sequences, each once");
    eq(gotA.received.map((m) => m.seq), [1, 2, 3, 4], "primary's sequences, each once");
    eq([gotA.opens, gotA.errors, gotB.opens, gotB.errors], [1, [], 1, []], "watch opens and errors (primary, companion)");
    await call(A, "closeWatch");
    await call(B, "closeWatch");
    log(`mailbox: link ${made.id}: 6 p2c and 4 c2p envelopes, stored then live`);
  } finally {
    await b.close();
  }
}
