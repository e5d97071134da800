// CORS from a page's view: run.mjs calls these on a page whose origin is
// in RELAY_CORS_ORIGINS and on one whose origin is not, and compares.
import { Link } from "/dist/link.js";

/**
 * probe fetches url with init and returns what the page may see: the
 * status, the headers it can read and the body as text; or, when fetch
 * rejects (what a CORS refusal looks like to a page: no status at all),
 * the error's name and message.
 */
async function probe(url, init = {}) {
  try {
    const resp = await fetch(url, init);
    const headers = {};
    resp.headers.forEach((v, k) => { headers[k] = v; });
    return { ok: true, status: resp.status, headers, body: await resp.text() };
  } catch (e) {
    return { ok: false, name: e.name, message: e.message };
  }
}

window.T = {
  origin: () => location.origin,
  /** A fresh link's id and access token (the mailbox bearer). */
  async newLink() {
    const l = await Link.generate();
    return { id: l.id, token: l.accessToken };
  },
  probe,
};
