// ICE servers for WebRTC (spec/mailbox.md, ICE): the relay's STUN and TURN
// servers with short-lived TURN credentials (coturn's REST scheme:
// username "<unix expiry>:<label>", credential base64(HMAC-SHA1)), in the
// shape of RTCIceServer, ready for new RTCPeerConnection().

import { NetworkError, relayErrorOf } from "./errors.js";
import type { Link } from "./link.js";

/** The relay's answer to GET …/ice. */
export interface IceConfig {
  /** STUN and TURN servers with their credentials, as RTCPeerConnection takes them. */
  iceServers: RTCIceServer[];
  /** Seconds the TURN credentials stay valid. */
  ttl: number;
}

/**
 * GET /v1/<app>/mailbox/<id>/ice with the link's bearer. Rejects with
 * RelayError for any other answer than 200 (404 when the app has not
 * enabled `ice` or the mailbox does not exist, 429 rate_limited after 6
 * requests in a burst, 502 upstream_unavailable), NetworkError when
 * fetch itself fails, TypeError for a body that is not the documented shape.
 */
export async function fetchIce(o: { relay: string; app: string; link: Link; fetch?: typeof fetch }): Promise<IceConfig> {
  const f = o.fetch ?? globalThis.fetch;
  const url = new URL(`/v1/${encodeURIComponent(o.app)}/mailbox/${encodeURIComponent(o.link.id)}/ice`, o.relay).toString();
  let resp: Response;
  try {
    resp = await f(url, { headers: { Authorization: `Bearer ${o.link.accessToken}` }, cache: "no-store" });
  } catch (e) {
    throw new NetworkError(`ice: GET ${url}: ${(e as Error).message}`, e);
  }
  if (resp.status !== 200) throw await relayErrorOf(resp, "ice");
  const body: unknown = await resp.json();
  return checkIce(body);
}

/** The body as an IceConfig, or TypeError saying what is wrong with it. */
function checkIce(body: unknown): IceConfig {
  const b = body as { iceServers?: unknown; ttl?: unknown } | null;
  if (b === null || typeof b !== "object" || !Array.isArray(b.iceServers)) {
    throw new TypeError(`ice: answer has no iceServers array: ${JSON.stringify(body)}`);
  }
  if (typeof b.ttl !== "number" || !(b.ttl > 0)) throw new TypeError(`ice: answer's ttl ${JSON.stringify(b.ttl)} is not a positive number`);
  for (const s of b.iceServers as unknown[]) {
    const urls = (s as { urls?: unknown } | null)?.urls;
    const ok = typeof urls === "string" || (Array.isArray(urls) && urls.length > 0 && urls.every((u) => typeof u === "string"));
    if (!ok) throw new TypeError(`ice: server without urls: ${JSON.stringify(s)}`);
  }
  return { iceServers: b.iceServers as RTCIceServer[], ttl: b.ttl };
}

/**
 * The RTCPeerConnection configuration of ice. relayOnly sets
 * iceTransportPolicy "relay": only TURN candidates, so that neither device
 * learns the other's addresses (and a test proves the TURN path).
 */
export function rtcConfiguration(ice: IceConfig, opts?: { relayOnly?: boolean }): RTCConfiguration {
  return {
    iceServers: ice.iceServers.map((s) => ({ ...s })),
    iceTransportPolicy: opts?.relayOnly ? "relay" : "all",
  };
}
