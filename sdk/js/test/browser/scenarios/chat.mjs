// Scenario 5: the example app (examples/chat) in two pages. Page A clicks
// "Create link" and shows the link's URL (the code in the fragment); page
// B opens it. First with WebRTC: both reach the data channel and a line
// each way arrives over it, nothing stored in the mailbox; B's page
// closes, A falls back to the mailbox for its next line, which B, opened
// again, gets from there before both are back on a channel. Then in two
// pages where RTCPeerConnection does not exist (no connect() possible):
// both stay on the mailbox and a line each way arrives as a sealed
// envelope, one stored per direction. The mailbox counts are read by the
// driver itself (Node, the link from the page's code), not by the app.

import { launch, openPage, eq, ok, need, log, STEP_MS } from "../lib.mjs";
import { Link } from "../../../dist/link.js";

const CODE = /^[A-Za-z0-9_-]{16,64}\.[A-Za-z0-9_-]{43}$/;

/** The HEAD counts of both directions of the link's mailbox. */
async function counts(relay, code) {
  const link = await Link.fromCode(code);
  const out = {};
  for (const dir of ["p2c", "c2p"]) {
    const resp = await fetch(`${relay}/v1/demo/mailbox/${link.id}/${dir}`, {
      method: "HEAD", headers: { Authorization: `Bearer ${link.accessToken}` }, signal: AbortSignal.timeout(STEP_MS),
    });
    eq(resp.status, 200, `HEAD ${dir}`);
    out[dir] = Number(resp.headers.get("x-relay-count"));
  }
  return out;
}

/** The chat's message list: [from, via, text] per line. */
const messages = (page) =>
  page.$$eval("#messages li", (lis) => lis.map((li) => [li.dataset.from, li.dataset.via, li.textContent]));

async function waitMessages(page, n) {
  await page.waitForFunction((k) => document.querySelectorAll("#messages li").length >= k, n, { timeout: STEP_MS });
  return messages(page);
}

async function say(page, text) {
  await page.fill("#input", text);
  await page.press("#input", "Enter");
}

/** Opens A, creates the link, opens B on A's URL; returns both and the code. */
async function pair(context, base, tag, init) {
  const A = await openPage(context, `${tag}-A`, base, init, false);
  await A.click("#create", { timeout: STEP_MS });
  await A.waitForFunction(() => document.getElementById("link-url").href.includes("#"), null, { timeout: STEP_MS });
  const href = await A.getAttribute("#link-url", "href");
  const code = await A.textContent("#link-code");
  ok(CODE.test(code), `link code ${JSON.stringify(code)}`);
  eq(new URL(href).hash, `#${code}`, "the link URL's fragment");
  eq(new URL(href).search, new URL(base).search, "the link URL's query (relay and app)");
  const B = await openPage(context, `${tag}-B`, href, init, false);
  // The code moved out of B's address bar.
  await B.waitForFunction(() => location.hash === "", null, { timeout: STEP_MS });
  return { A, B, code };
}

const state = (page, s, ms = STEP_MS) =>
  page.waitForSelector(`#status[data-state="${s}"]`, { timeout: ms }).catch((e) => {
    throw new Error(`status never became ${s}: ${e.message}`);
  });

export async function run() {
  const origin = need("PAGE_ORIGIN"), relay = need("RELAY_ORIGIN");
  const base = `${origin}/examples/chat/?relay=${encodeURIComponent(relay)}&app=demo`;
  const b = await launch();
  try {
    // With WebRTC: the data channel.
    const one = await pair(b.context, base, "rtc");
    await Promise.all([state(one.A, "channel", 60_000), state(one.B, "channel", 60_000)]);
    await say(one.A, "hello from A over the channel");
    eq(await waitMessages(one.B, 1), [["peer", "channel", "hello from A over the channel"]], "B's messages");
    await say(one.B, "hi from B over the channel \u2713");
    eq(await waitMessages(one.A, 2), [
      ["me", "channel", "hello from A over the channel"],
      ["peer", "channel", "hi from B over the channel \u2713"],
    ], "A's messages");
    eq(await messages(one.B), [
      ["peer", "channel", "hello from A over the channel"],
      ["me", "channel", "hi from B over the channel \u2713"],
    ], "B's messages");
    eq(await counts(relay, one.code), { p2c: 0, c2p: 0 }, "envelopes stored with the channel open");

    // B goes away: A's channel closes and A's line is stored; B comes
    // back on the same URL, gets it from the mailbox, and the two are
    // back on a data channel.
    await one.B.close();
    await state(one.A, "mailbox", 60_000);
    await say(one.A, "while B is away");
    await one.A.waitForFunction(() => document.querySelectorAll("#messages li").length >= 3, null, { timeout: STEP_MS });
    eq((await messages(one.A))[2], ["me", "mailbox", "while B is away"], "A's line while B is away");
    const back = await openPage(b.context, "rtc-B2", await one.A.getAttribute("#link-url", "href"), undefined, false);
    eq(await waitMessages(back, 1), [["peer", "mailbox", "while B is away"]], "B's messages when back");
    await Promise.all([state(one.A, "channel", 60_000), state(back, "channel", 60_000)]);
    await say(back, "back over the channel");
    eq((await waitMessages(one.A, 4))[3], ["peer", "channel", "back over the channel"], "A's line from B when back");
    eq(await counts(relay, one.code), { p2c: 1, c2p: 0 }, "envelopes stored (the line while B was away)");

    // Without RTCPeerConnection: envelopes.
    const noRTC = () => {
      delete window.RTCPeerConnection;
      delete window.webkitRTCPeerConnection;
    };
    const two = await pair(b.context, base, "nortc", noRTC);
    await Promise.all([state(two.A, "mailbox"), state(two.B, "mailbox")]);
    for (const p of [two.A, two.B]) {
      const text = await p.textContent("#status");
      ok(text.includes("no WebRTC"), `status without WebRTC: ${JSON.stringify(text)}`);
    }
    await say(two.A, "hello from A through envelopes");
    eq(await waitMessages(two.B, 1), [["peer", "mailbox", "hello from A through envelopes"]], "B's messages without WebRTC");
    await say(two.B, "hi from B through envelopes");
    eq(await waitMessages(two.A, 2), [
      ["me", "mailbox", "hello from A through envelopes"],
      ["peer", "mailbox", "hi from B through envelopes"],
    ], "A's messages without WebRTC");
    eq(await waitMessages(two.B, 2), [
      ["peer", "mailbox", "hello from A through envelopes"],
      ["me", "mailbox", "hi from B through envelopes"],
    ], "B's messages without WebRTC");
    eq(await counts(relay, two.code), { p2c: 1, c2p: 1 }, "envelopes stored without WebRTC");
    log("chat: a line each way over the data channel, and through envelopes without WebRTC");
  } finally {
    await b.close();
  }
}
