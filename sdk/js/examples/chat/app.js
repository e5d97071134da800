// A two-device chat on edgerelay's mailbox: device A creates a link and
// shows its code and a URL carrying it in the fragment; device B opens
// that URL. Both claim the link's mailbox and watch the direction they
// read. Messages go over a WebRTC data channel once connect() has opened
// one, and as sealed mailbox envelopes (send + watch) whenever it is not
// open: before it opens, after it drops, or in a browser without WebRTC.
// The relay sees only sealed envelopes and signal frames; the link key
// never leaves the two devices (the fragment is not sent to any server).
//
// URL parameters: ?relay=<mailbox origin> (default http://127.0.0.1:8080),
// ?app=<mailbox app with signal and ice> (default demo), ?relayOnly=1 to
// use TURN candidates only.

import { Link, Mailbox, connect } from "../../dist/index.js";

const params = new URLSearchParams(location.search);
const relay = params.get("relay") || "http://127.0.0.1:8080";
const app = params.get("app") || "demo";
const relayOnly = params.get("relayOnly") === "1";

// Kept per tab (sessionStorage), so that a reload finds its link again and
// two windows of one browser stay two devices.
const STORAGE_KEY = "edgerelay-chat-link";

const $ = (id) => document.getElementById(id);
const decoder = new TextDecoder();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** @type {Mailbox | null} */
let mailbox = null;
/** The open data channel, or null while messages go through the mailbox. */
let channel = null;
/** Mailbox sends are chained so that they are stored in the order typed. */
let sending = Promise.resolve();

function setStatus(state, text) {
  const s = $("status");
  s.dataset.state = state;
  s.textContent = text;
}

function showError(e) {
  console.error(e);
  const el = $("error");
  el.textContent = String(e && e.message ? e.message : e);
  el.hidden = false;
}

/** Appends a message: from "me" or "peer", via "channel" or "mailbox". */
function show(from, via, text) {
  const li = document.createElement("li");
  li.dataset.from = from;
  li.dataset.via = via;
  li.textContent = text;
  $("messages").append(li);
  li.scrollIntoView({ block: "nearest" });
}

function showLink(link) {
  const url = new URL(location.href);
  url.hash = link.toCode();
  $("link-url").href = url.href;
  $("link-url").textContent = url.href;
  $("link-code").textContent = link.toCode();
  $("link").hidden = false;
}

/** Claims the mailbox, watches it and keeps trying for a data channel. */
async function start(link, role) {
  $("setup").hidden = true;
  $("chat").hidden = false;
  mailbox = new Mailbox({ relay, app, link, role });
  await mailbox.claim();
  mailbox.watch({
    onMessage: (m) => show("peer", "mailbox", decoder.decode(m.plaintext)),
    onError: (e) => console.warn(`mailbox watch: ${e.message}`),
  });
  setStatus("mailbox", "Linked. Messages go through the relay's mailbox, sealed, until a data channel opens.");
  keepConnected(link, role).catch(showError);
}

/**
 * connect() in a loop: while the channel is open messages go over it;
 * when it closes, or an attempt fails, the mailbox carries them and
 * another attempt follows after a growing pause (the relay hands out ICE
 * credentials at most every 30 s per mailbox after a burst of 6, and says
 * how long to wait when asked too often).
 */
async function keepConnected(link, role) {
  if (typeof globalThis.RTCPeerConnection !== "function") {
    setStatus("mailbox", "Linked. This browser has no WebRTC: messages go through the relay's mailbox, sealed.");
    return;
  }
  for (let failures = 0; ; ) {
    let conn;
    try {
      conn = await connect({ relay, app, link, role, relayOnly, timeoutMs: 60_000 });
    } catch (e) {
      failures++;
      const wait = e.retryAfter ? e.retryAfter * 1000 : Math.min(60_000, 2_000 * 2 ** failures);
      console.warn(`connect: ${e.message}; again in ${Math.round(wait / 1000)} s`);
      await sleep(wait);
      continue;
    }
    failures = 0;
    conn.channel.onmessage = (ev) => {
      if (typeof ev.data === "string") show("peer", "channel", ev.data);
    };
    await connected(conn);
    channel = null;
    conn.pc.close();
    conn.signal.close();
    setStatus("mailbox", "The data channel closed: messages go through the mailbox while it reconnects.");
    await sleep(2_000);
  }
}

/**
 * Uses conn's channel while its peer connection is connected, the mailbox
 * while it is interrupted ("disconnected" may come back), and returns when
 * the connection is over: the channel closed, the connection failed, or
 * the other device's signal socket came back while ours is not connected
 * (it reloaded and negotiates anew; waiting for "failed" would take ~15 s).
 */
function connected(conn) {
  return new Promise((resolve) => {
    let rejoined = false;
    const check = () => {
      const s = conn.pc.connectionState;
      if (conn.channel.readyState !== "open" || s === "failed" || s === "closed" || (rejoined && s !== "connected")) {
        channel = null;
        resolve();
      } else if (s === "connected") {
        channel = conn.channel;
        setStatus("channel", `Connected: messages go over a WebRTC data channel${relayOnly ? " (through TURN)" : ""}.`);
      } else {
        channel = null;
        setStatus("mailbox", "The data channel is interrupted: messages go through the mailbox meanwhile.");
      }
    };
    conn.channel.addEventListener("close", check);
    conn.pc.addEventListener("connectionstatechange", check);
    conn.signal.onpeer = (present) => {
      rejoined ||= present;
      check();
    };
    check();
  });
}

function send(text) {
  if (channel && channel.readyState === "open") {
    channel.send(text);
    show("me", "channel", text);
    return;
  }
  sending = sending
    .then(() => mailbox.send(text))
    .then(() => show("me", "mailbox", text), showError);
}

async function main() {
  $("form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("input").value;
    if (!text || !mailbox) return;
    $("input").value = "";
    send(text);
  });

  // Device B: the link came in the fragment. It moves to sessionStorage
  // and out of the address bar, so the key is not left in this tab's
  // history entry.
  const code = decodeURIComponent(location.hash.slice(1));
  if (code) {
    sessionStorage.setItem(STORAGE_KEY, JSON.stringify({ role: "companion", code }));
    history.replaceState(null, "", location.pathname + location.search);
  }
  const saved = JSON.parse(sessionStorage.getItem(STORAGE_KEY) || "null");
  if (saved) {
    const link = await Link.fromCode(saved.code);
    if (saved.role === "primary") showLink(link);
    await start(link, saved.role);
    return;
  }

  // Device A.
  $("create").addEventListener("click", async () => {
    $("create").disabled = true;
    try {
      const link = await Link.generate();
      sessionStorage.setItem(STORAGE_KEY, JSON.stringify({ role: "primary", code: link.toCode() }));
      showLink(link);
      await start(link, "primary");
    } catch (e) {
      showError(e);
    }
  });
}

main().catch(showError);
