// The WebRTC bench's browser side (bench/turnbench/webrtc.go runs it):
// one headless Chromium, two pages of page.html, and per run a relay-only
// data channel from the first page to the second through the TURN server
// named in the command, with a transfer the Go side times.
//
// Protocol: one JSON object per line. Go writes
//   {"cmd":"open","urls":[...],"username":"...","credential":"..."}
// and the driver answers {"ready":true,"pair":{...},"openMs":N} once the
// channel is open; Go takes the server's CPU time and drops, then writes
//   {"cmd":"send","bytes":N,"message":M}
// and the driver answers {"done":true,"bytes":N,"messages":K,"ms":T} when
// the second page has every byte; Go takes its figures again and writes
// {"cmd":"close"}, answered {"closed":true}; {"cmd":"quit"} ends it. An
// error is answered {"error":"..."} and the driver goes on reading.
//
// playwright-core comes from sdk/js/node_modules (SDK_JS names sdk/js).
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { createInterface } from "node:readline";

const sdk = process.env.SDK_JS;
if (!sdk) throw new Error("driver.mjs: SDK_JS (the sdk/js directory) is not set");
const { chromium } = createRequire(join(sdk, "package.json"))("playwright-core");
const STEP_MS = 60_000;

function out(obj) { process.stdout.write(JSON.stringify(obj) + "\n"); }

function timeout(p, ms, what) {
  let t;
  return Promise.race([p, new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`${what}: no answer within ${ms} ms`)), ms); })])
    .finally(() => clearTimeout(t));
}

const dir = mkdtempSync(join(tmpdir(), "turnbench-chromium-"));
const context = await chromium.launchPersistentContext(dir, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-renderer-backgrounding",
    "--disable-background-timer-throttling", "--disable-backgrounding-occluded-windows"],
  timeout: STEP_MS,
});
const url = pathToFileURL(join(dirname(fileURLToPath(import.meta.url)), "page.html")).href;
const pages = [];
for (const name of ["sender", "receiver"]) {
  const p = await context.newPage();
  p.on("pageerror", (e) => process.stderr.write(`[${name}] pageerror: ${e.message}\n`));
  p.on("console", (m) => { if (m.type() === "error") process.stderr.write(`[${name}] ${m.text()}\n`); });
  await p.goto(url, { timeout: STEP_MS });
  pages.push(p);
}
const [A, B] = pages;
const ev = (page, fn, ...args) => timeout(page.evaluate(([f, a]) => window.T[f](...a), [fn, args]), STEP_MS, `T.${fn}`);

async function handle(cmd) {
  switch (cmd.cmd) {
    case "open": {
      const ice = [{ urls: cmd.urls, username: cmd.username, credential: cmd.credential }];
      const t0 = Date.now();
      const offer = await ev(A, "offer", ice);
      const answer = await ev(B, "answer", ice, offer);
      await ev(A, "accept", answer);
      await Promise.all([ev(A, "opened"), ev(B, "opened")]);
      return { ready: true, openMs: Date.now() - t0, pair: [await ev(A, "pair"), await ev(B, "pair")] };
    }
    case "send": {
      const recv = ev(B, "received");
      await ev(A, "send", cmd.bytes, cmd.message);
      const r = await timeout(recv, 10 * STEP_MS, "the receiver's end");
      return { done: true, ...r };
    }
    case "close":
      await ev(A, "close");
      await ev(B, "close");
      return { closed: true };
    case "quit":
      return null;
  }
  throw new Error(`unknown command ${JSON.stringify(cmd)}`);
}

out({ started: true });
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  let res;
  try {
    res = await handle(JSON.parse(line));
  } catch (e) {
    out({ error: e.message });
    continue;
  }
  if (res === null) break;
  out(res);
}
await context.close().catch(() => {});
rmSync(dir, { recursive: true, force: true });
