// The driver's helpers: Chromium launched the way this machine needs it,
// pages opened with their console forwarded, page functions called with a
// bound on every wait, and exact assertions whose message says what
// differed.

import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isDeepStrictEqual, inspect } from "node:util";

/** The bound of one step (a page call, a navigation, a wait). */
export const STEP_MS = 30_000;

/** Chromium's flags on a closed network: without them it floods refused connections. */
const QUIET_FLAGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/**
 * launch starts headless Chromium with a fresh user data dir (removed by
 * the returned close). extraArgs are added to the flags, e.g. the SPKI pin
 * of the agent listener's certificate. --ignore-certificate-errors-spki-list
 * is honoured only with a user data dir, hence a persistent context.
 */
export async function launch(extraArgs = []) {
  const dir = mkdtempSync(join(tmpdir(), "edgerelay-chromium-"));
  const context = await chromium.launchPersistentContext(dir, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: [...QUIET_FLAGS, ...extraArgs],
    timeout: STEP_MS,
  });
  context.setDefaultTimeout(STEP_MS);
  context.setDefaultNavigationTimeout(STEP_MS);
  return {
    context,
    async close() {
      await withTimeout(context.close(), 10_000, "close Chromium").catch((e) => log(`close: ${e.message}`));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** log prints one line to stdout, which the Go test shows on failure. */
export function log(line) {
  process.stdout.write(`${new Date().toISOString().slice(11, 23)} ${line}\n`);
}

/**
 * openPage opens url in a new page named name (for the log) and waits for
 * the page module to set window.T (its functions for the driver), unless
 * waitForT is false (the example app has no T: its module has run once the
 * load event fired, which goto waits for). The page's console and errors
 * are forwarded to the log. init, when given, runs before any page script
 * (page.addInitScript).
 */
export async function openPage(context, name, url, init, waitForT = true) {
  const page = await context.newPage();
  page.on("console", (m) => log(`[${name}] ${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => log(`[${name}] pageerror: ${e.stack || e.message}`));
  // net::ERR_ABORTED is the page cancelling a body it does not read (the
  // SDK does, for answers without one): not worth a line.
  page.on("requestfailed", (r) => {
    const why = r.failure()?.errorText;
    if (why !== "net::ERR_ABORTED") log(`[${name}] request failed: ${r.method()} ${r.url()}: ${why}`);
  });
  if (init) await page.addInitScript(init);
  log(`[${name}] open ${url}`);
  const resp = await page.goto(url, { timeout: STEP_MS });
  if (!resp || resp.status() !== 200) throw new Error(`${name}: GET ${url}: ${resp ? resp.status() : "no answer"}`);
  if (!waitForT) return page;
  await page.waitForFunction(() => window.T !== undefined, null, { timeout: STEP_MS }).catch((e) => {
    throw new Error(`${name}: the page module did not start (window.T unset; see its errors above): ${e.message}`);
  });
  return page;
}

/**
 * call runs window.T[fn](...args) in page and returns its result (JSON
 * values, as page.evaluate transfers them), failing after ms.
 */
export async function call(page, fn, args = [], ms = STEP_MS) {
  return withTimeout(
    page.evaluate(([f, a]) => {
      if (typeof window.T[f] !== "function") throw new Error(`page has no T.${f}`);
      return window.T[f](...a);
    }, [fn, args]),
    ms,
    `T.${fn}`,
  );
}

/** withTimeout rejects after ms with an error naming what timed out. */
export function withTimeout(promise, ms, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, t]).finally(() => clearTimeout(timer));
}

/** eq throws unless actual deep-equals expected (strict), naming what. */
export function eq(actual, expected, what) {
  if (!isDeepStrictEqual(actual, expected)) {
    throw new Error(`${what}: got ${inspect(actual, { depth: 6 })}, want ${inspect(expected, { depth: 6 })}`);
  }
}

/** ok throws unless cond, with message. */
export function ok(cond, message) {
  if (!cond) throw new Error(message);
}

/** need reads a required environment variable (the Go test sets them). */
export function need(name) {
  const v = process.env[name];
  if (!v) throw new Error(`run.mjs: environment variable ${name} is not set (the Go test sets it)`);
  return v;
}
