// Package ndjson reads, checks and edits the NDJSON frames of the agent relay
// (contenox-relay/1) without decoding them.
//
// The relay routes a frame on its envelope (type, instance, session, id, re)
// and forwards the bytes it received: it never decodes and re-encodes a line,
// so fields it does not know survive. Everything here works on the line's
// bytes:
//
//   - Reader cuts a byte stream into lines, enforcing the 16 MiB line limit,
//     and allocates nothing per line.
//   - Scan validates a line as exactly one JSON object and reports where the
//     envelope fields are (offsets into the line, not copies); ScanMessage
//     does the same for a client's WebSocket message.
//   - Splice copies a client's line with instance and session replaced, every
//     other byte as it was.
//   - AppendString writes a JSON string.
//
// # Reading the line the way the endpoint will
//
// Endpoints decode a line with Go's encoding/json into a struct. The relay
// must route a line the way the endpoint will read it, or drop it, so Scan
// follows that decoder where it matters:
//
//   - Keys match case-insensitively, with encoding/json's folding (fold.go):
//     ASCII letters fold to one another, and a non-ASCII rune folds to the
//     smallest rune of its unicode.SimpleFold orbit. The only non-ASCII runes
//     that fold to an ASCII letter are U+017F (ſ, folds to s) and U+212A
//     (Kelvin sign, folds to k); "ſession" and "Type" are the session and
//     type fields. Keys written with escapes ("typ\u0065") are unescaped
//     first.
//   - Of duplicate keys the last one wins, except that null leaves a field as
//     it was (encoding/json skips null for a string or a number).
//   - A field of the wrong JSON type ("type":5, "seq":"1", "seq":1.0) makes
//     encoding/json fail, so Scan fails too.
//
// Scan is stricter than encoding/json in a few ways, each of which only
// drops a line an endpoint might have accepted, never routes one
// differently: every string must be valid UTF-8 (lines go to browsers as
// WebSocket text, which must be); nesting is bounded (MaxDepth); a raw line
// feed is not accepted as whitespace (a line holding one would become two on
// the link); an envelope field holding a lone surrogate escape ("\ud800",
// which encoding/json turns into U+FFFD) is refused.
package ndjson
