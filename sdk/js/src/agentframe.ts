// Reading one agent relay frame (spec/agent-relay.md, Frames) the way the
// endpoints read it: runtimes decode lines with Go's encoding/json into the
// envelope struct, which matches keys case-insensitively (with its own
// folding) and lets the last duplicate win. JSON.parse matches keys exactly,
// so it validates the line and decodes values, while a small scanner finds
// the top-level members, their keys as encoding/json folds them, and each
// value's raw text: the payload's text is kept byte for byte (payloadRaw),
// because the relay and the runtime carry it raw and a re-encoding would
// change big numbers, duplicate keys and spacing.

/** One frame of the agent relay, as the endpoints read it. */
export interface AgentFrame {
  /** The frame's type; `relay.` types are the relay's control frames. */
  type: string;
  /** The instance the frame belongs to (absent when empty). */
  instance?: string;
  /** The attachment the frame belongs to (absent when empty). */
  session?: string;
  /** A request's id (absent when empty). */
  id?: string;
  /** The id of the request this frame answers (absent when empty). */
  re?: string;
  /** Sequence number (absent when 0). */
  seq?: number;
  /** Trace id (absent when empty). */
  trace?: string;
  /** The payload, JSON.parse of payloadRaw (absent when the frame has none). Big integers lose precision here: use payloadRaw. */
  payload?: unknown;
  /** The payload's JSON text exactly as it stood in the line. */
  payloadRaw?: string;
  /** The whole line as received. */
  raw: string;
}

/** A top-level member of the line: its key folded as encoding/json folds it, and its value's raw text. */
interface Member {
  key: string;
  value: string;
}

/**
 * Parses one frame line. Throws TypeError when the line is not one JSON
 * object, has no non-empty string `type`, or an envelope field of the wrong
 * JSON type (`"type":5`, `"seq":"1"`, `"seq":1.5`: encoding/json fails on
 * those, so the endpoint drops the frame); RangeError for a seq above
 * Number.MAX_SAFE_INTEGER.
 *
 * Keys match as encoding/json matches them ("Type", "ſession" and
 * "typ\u0065" are type, session and type), the last duplicate wins, and a
 * null leaves a string or number field as it was (encoding/json skips it);
 * a null payload is kept as the payload `null`, as json.RawMessage keeps it.
 */
export function parseAgentFrame(line: string): AgentFrame {
  if (typeof line !== "string") throw new TypeError(`agent frame: want a string, got ${typeof line}`);
  let whole: unknown;
  try {
    whole = JSON.parse(line);
  } catch (e) {
    throw new TypeError(`agent frame: not JSON: ${(e as Error).message}`);
  }
  if (whole === null || typeof whole !== "object" || Array.isArray(whole)) {
    throw new TypeError(`agent frame: not a JSON object: ${clip(line)}`);
  }
  const f: AgentFrame = { type: "", raw: line };
  for (const m of members(line)) {
    switch (m.key) {
      case "type":
      case "instance":
      case "session":
      case "id":
      case "re":
      case "trace":
        if (m.value !== "null") f[m.key] = stringField(m.key, m.value);
        break;
      case "seq":
        if (m.value !== "null") f.seq = seqField(m.value);
        break;
      case "payload":
        f.payloadRaw = m.value;
        break;
    }
  }
  // Empty strings and a 0 seq count as absent (the wire's omitempty).
  for (const k of ["instance", "session", "id", "re", "trace"] as const) {
    if (f[k] === "") delete f[k];
  }
  if (f.seq === 0) delete f.seq;
  if (!f.type) throw new TypeError(`agent frame: no type: ${clip(line)}`);
  if (f.payloadRaw !== undefined) f.payload = JSON.parse(f.payloadRaw);
  return f;
}

function stringField(key: string, raw: string): string {
  const v: unknown = JSON.parse(raw);
  if (typeof v !== "string") throw new TypeError(`agent frame: ${key} is not a string: ${clip(raw)}`);
  return v;
}

function seqField(raw: string): number {
  // encoding/json decodes a uint64 with strconv.ParseUint: digits only
  // (no sign, fraction or exponent).
  if (!/^[0-9]+$/.test(raw)) throw new TypeError(`agent frame: seq is not an unsigned integer: ${clip(raw)}`);
  const n = Number(raw);
  if (!Number.isSafeInteger(n)) throw new RangeError(`agent frame: seq ${clip(raw)} is above 2^53-1`);
  return n;
}

/**
 * The key folded the way encoding/json folds keys (fold.go), for the names
 * of the envelope: ASCII letters to lower case, U+017F (ſ) to s and U+212A
 * (Kelvin sign) to k, the only non-ASCII runes whose fold orbit holds an
 * ASCII letter. Any other key is returned unchanged; it cannot match an
 * envelope name.
 */
export function foldKey(key: string): string {
  let out = "";
  for (const ch of key) {
    if (ch >= "a" && ch <= "z") out += ch;
    else if (ch >= "A" && ch <= "Z") out += ch.toLowerCase();
    else if (ch === "\u017f") out += "s";
    else if (ch === "\u212a") out += "k";
    else return key;
  }
  return out;
}

/**
 * The top-level members of a line that JSON.parse accepted as an object, in
 * order: keys unescaped (JSON.parse of the key token) and folded, values as
 * their raw text. The line is valid JSON, so the scanner only needs to find
 * where each token ends.
 */
function members(s: string): Member[] {
  const out: Member[] = [];
  let i = ws(s, 0);
  if (s[i] !== "{") throw new TypeError("agent frame: not an object");
  i = ws(s, i + 1);
  if (s[i] === "}") return out;
  for (;;) {
    const keyEnd = stringEnd(s, i);
    const key = foldKey(JSON.parse(s.slice(i, keyEnd)) as string);
    i = ws(s, keyEnd);
    i = ws(s, i + 1); // the colon
    const valueEnd = valueEndAt(s, i);
    out.push({ key, value: s.slice(i, valueEnd) });
    i = ws(s, valueEnd);
    if (s[i] === "}") return out;
    i = ws(s, i + 1); // the comma
  }
}

/** The index after JSON whitespace from i. */
function ws(s: string, i: number): number {
  while (i < s.length) {
    const c = s.charCodeAt(i);
    if (c !== 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) break;
    i++;
  }
  return i;
}

/** The index after the string token starting at i (a quote). */
function stringEnd(s: string, i: number): number {
  for (let j = i + 1; j < s.length; j++) {
    const c = s[j];
    if (c === "\\") j++; // skip the escaped character (\" \\ or the u of \uXXXX)
    else if (c === '"') return j + 1;
  }
  throw new TypeError("agent frame: unterminated string");
}

/** The index after the value starting at i. */
function valueEndAt(s: string, i: number): number {
  const c = s[i];
  if (c === '"') return stringEnd(s, i);
  if (c === "{" || c === "[") {
    let depth = 0;
    for (let j = i; j < s.length; j++) {
      const d = s[j];
      if (d === '"') j = stringEnd(s, j) - 1;
      else if (d === "{" || d === "[") depth++;
      else if (d === "}" || d === "]") {
        depth--;
        if (depth === 0) return j + 1;
      }
    }
    throw new TypeError("agent frame: unterminated value");
  }
  // A number, true, false or null: up to the next delimiter.
  let j = i;
  while (j < s.length && !",}] \t\r\n".includes(s[j]!)) j++;
  return j;
}

function clip(s: string): string {
  return s.length > 80 ? JSON.stringify(s.slice(0, 80)) + "…" : JSON.stringify(s);
}
