// One device of a link with a data channel from connect(): run.mjs drives
// two of these (scenarios/rtc.mjs), reads the selected ICE candidate pair
// from getStats and moves a few MB each way, compared by SHA-256.
import { Link } from "/dist/link.js";
import { connect } from "/dist/connect.js";
import { Mailbox } from "/dist/mailbox.js";
import { hex } from "/dist/bytes.js";

let link, conn;
const chunks = [];
let ended = false, messages = 0;

async function sha256(parts) {
  let n = 0;
  for (const p of parts) n += p.byteLength;
  const all = new Uint8Array(n);
  let off = 0;
  for (const p of parts) { all.set(p, off); off += p.byteLength; }
  return { bytes: n, sha256: hex(new Uint8Array(await crypto.subtle.digest("SHA-256", all))) };
}

window.T = {
  origin: () => location.origin,
  async generate() {
    link = await Link.generate();
    return link.toCode();
  },
  async fromCode(code) {
    link = await Link.fromCode(code);
    return link.id;
  },
  /** Claims the link's mailbox (the signal endpoint needs it to exist). */
  claim(relay, role) {
    return new Mailbox({ relay, app: "demo", link, role }).claim();
  },
  /** connect() as role; resolves when the data channel is open. */
  async connect(relay, role, relayOnly, timeoutMs) {
    conn = await connect({ relay, app: "demo", link, role, relayOnly, timeoutMs });
    const ch = conn.channel;
    ch.binaryType = "arraybuffer";
    // Set here, in the task connect() resolved in, so nothing the other
    // side sends after its own open is missed.
    ch.onmessage = (ev) => {
      messages++;
      if (typeof ev.data === "string") {
        if (ev.data === "end") ended = true;
        else console.log(`unexpected text ${ev.data.slice(0, 80)}`);
      } else {
        chunks.push(new Uint8Array(ev.data));
      }
    };
    return { readyState: ch.readyState, label: ch.label, iceTransportPolicy: conn.pc.getConfiguration().iceTransportPolicy };
  },
  /**
   * The selected candidate pair of the data channel's transport: both
   * candidates' type, address, port, protocol and (local) the ICE server
   * url they came from.
   */
  async selectedPair() {
    const stats = await conn.pc.getStats();
    const byId = new Map();
    stats.forEach((s) => byId.set(s.id, s));
    const transports = [...byId.values()].filter((s) => s.type === "transport" && s.selectedCandidatePairId);
    if (transports.length !== 1) throw new Error(`${transports.length} transports with a selected pair`);
    const pair = byId.get(transports[0].selectedCandidatePairId);
    const pick = (c) => ({
      candidateType: c.candidateType, address: c.address, port: c.port, protocol: c.protocol,
      relayProtocol: c.relayProtocol, url: c.url,
    });
    return { state: pair.state, local: pick(byId.get(pair.localCandidateId)), remote: pick(byId.get(pair.remoteCandidateId)) };
  },
  /**
   * Sends size random bytes in 16 KiB messages (waiting while more than
   * 1 MiB is buffered), then the text "end"; returns their count and hash.
   */
  async sendRandom(size) {
    const ch = conn.channel;
    ch.bufferedAmountLowThreshold = 256 * 1024;
    const sent = [];
    for (let off = 0; off < size; off += 16384) {
      const m = crypto.getRandomValues(new Uint8Array(Math.min(16384, size - off)));
      sent.push(m);
      while (ch.bufferedAmount > 1024 * 1024) {
        await new Promise((resolve) => ch.addEventListener("bufferedamountlow", resolve, { once: true }));
      }
      ch.send(m);
    }
    ch.send("end");
    return sha256(sent);
  },
  /** Waits (at most ms) for the other side's "end"; returns what came before it. */
  async received(ms) {
    const until = Date.now() + ms;
    while (!ended && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    return { ended, messages, ...(await sha256(chunks)) };
  },
  close() {
    conn.channel.close();
    conn.pc.close();
    conn.signal.close();
  },
};
