// One device of a link in a browser: claims the mailbox, sends sealed
// envelopes and watches the other direction. run.mjs drives a primary and
// a companion page (scenarios/mailbox.mjs). Plaintexts cross as strings
// (UTF-8) or as hex for bytes, and come back as hex, since page.evaluate
// carries JSON.
import { Link } from "/dist/link.js";
import { Mailbox } from "/dist/mailbox.js";
import { hex, fromHex } from "/dist/bytes.js";

let link, mbox, watcher;
/** What the watcher delivered, in order: {seq, hex} (hex: the plaintext). */
const received = [];
let opens = 0;
const errors = [];

window.T = {
  origin: () => location.origin,
  /** Makes a fresh link (device A) and returns its code. */
  async generate() {
    link = await Link.generate();
    return { code: link.toCode(), id: link.id, token: link.accessToken };
  },
  /** Takes the link from device A's code (device B). */
  async fromCode(code) {
    link = await Link.fromCode(code);
    return { id: link.id, token: link.accessToken };
  },
  /** The Mailbox of this device's role on relay; returns its directions. */
  mailbox(relay, role) {
    mbox = new Mailbox({ relay, app: "demo", link, role });
    return { id: mbox.id, writes: mbox.writes, reads: mbox.reads };
  },
  claim: () => mbox.claim(),
  /** Sends a string, or bytes given as {hex}; returns the seq used. */
  send: (m) => mbox.send(typeof m === "string" ? m : fromHex(m.hex)),
  /** The raw stored envelope of dir/seq, in hex (to check it is sealed). */
  async raw(dir, seq) {
    return hex(await mbox.get(dir, seq));
  },
  watch() {
    watcher = mbox.watch({
      onMessage(m) {
        received.push({ seq: m.seq, hex: hex(m.plaintext) });
      },
      onOpen() { opens++; },
      onError(e) { errors.push(`${e.name}: ${e.message}`); console.log(`watch error: ${e.name}: ${e.message}`); },
    });
  },
  /** Waits until the watcher delivered n messages (or ms passed) and returns all of them. */
  async received(n, ms) {
    const end = Date.now() + ms;
    while (received.length < n && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    return { received: received.slice(), opens, errors: errors.slice() };
  },
  async closeWatch() {
    watcher.close();
    await watcher.closed;
  },
};
