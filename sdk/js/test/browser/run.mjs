// The browser tests' driver: runs the scenarios named in BROWSER_SCENARIO
// (comma-separated; each is scenarios/<name>.mjs) in headless Chromium
// against the relay and page server the Go test started (sdk/js/e2e,
// browser_test.go, which sets every variable below). Prints "PASS <name>"
// or "FAIL <name>: <why>" per scenario and exits 1 when any failed.
// Every wait is bounded (lib.mjs STEP_MS) and the whole run by RUN_MS.
//
//   PAGE_ORIGIN   the page server's origin, listed in RELAY_CORS_ORIGINS
//   OTHER_ORIGIN  the same files on an origin that is not listed
//   RELAY_ORIGIN  the relay's mailbox listener
//   TURN_ADDR     the relay's TURN listener, host:port
//   AGENT_ORIGIN, AGENT_SPKI, AGENT_INSTANCE, AGENT_TOKEN, PAIR_KEYS: see the scenarios

import { log, need, withTimeout } from "./lib.mjs";

const RUN_MS = 150_000;

const names = need("BROWSER_SCENARIO").split(",").filter(Boolean);
// A run that hangs past its bound is a failure with what it printed so far;
// exiting kills the Chromium that playwright launched.
const watchdog = setTimeout(() => {
  log(`FAIL run: not done within ${RUN_MS} ms`);
  process.exit(1);
}, RUN_MS);

let failed = 0;
for (const name of names) {
  if (!/^[a-z0-9-]+$/.test(name)) throw new Error(`bad scenario name ${JSON.stringify(name)}`);
  const t0 = Date.now();
  try {
    const mod = await import(`./scenarios/${name}.mjs`);
    await withTimeout(mod.run(), RUN_MS, `scenario ${name}`);
    process.stdout.write(`PASS ${name}\n`);
    log(`${name} took ${Date.now() - t0} ms`);
  } catch (e) {
    failed++;
    process.stdout.write(`FAIL ${name}: ${e && e.stack ? e.stack : e}\n`);
  }
}
clearTimeout(watchdog);
process.exit(failed ? 1 : 0);
