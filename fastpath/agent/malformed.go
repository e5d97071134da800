package agent

import (
	"bytes"

	"edgerelay/fastpath/jsonlex"
	"edgerelay/fastpath/ndjson"
)

// requestID finds the id of a client message that did not scan, so that a
// request gets its malformed_frame answer whatever made it fail: raw line
// breaks, a field of the wrong type, trailing bytes, nesting deeper than
// any decoder takes (the scanner stops at ndjson.MaxDepth, encoding/json at
// 10,000), or a syntax error after the id. It walks the top-level object
// only, as far as it holds together, and keeps the last string member whose
// name is "id" under encoding/json's key matching (for "id" that is ASCII
// case folding), decoded as the scanner decodes ids. Nested values are
// skipped by counting brackets, so that no depth is too deep and the walk
// needs no stack. Nil when no id string was found.
//
// This is the error path: it may allocate, and it is linear in the message.
func requestID(msg []byte) []byte {
	var id []byte
	i := skipBlanks(msg, 0)
	if i >= len(msg) || msg[i] != '{' {
		return nil // not an object: nothing says it is a request
	}
	for i = skipBlanks(msg, i+1); i < len(msg) && msg[i] == '"'; {
		keyStart := i
		if i = skipString(msg, i); i > len(msg) {
			break
		}
		isID := keyIsID(msg[keyStart:i])
		if i = skipBlanks(msg, i); i >= len(msg) || msg[i] != ':' {
			break
		}
		if i = skipBlanks(msg, i+1); i >= len(msg) {
			break
		}
		switch c := msg[i]; {
		case c == '"':
			end, escaped, err := jsonlex.ScanString(msg, i)
			if err.Failed() {
				// Not a valid string: not an id anyone could match, and
				// it may hold raw line breaks; skip it leniently.
				end = skipString(msg, i)
			} else if isID {
				f := ndjson.Field{Start: i + 1, End: end - 1, Escaped: escaped}
				id = f.AppendValue(id[:0], msg)
			}
			i = end
		case c == '{' || c == '[':
			i = skipNested(msg, i)
		default: // a number or literal: up to the next separator
			for i < len(msg) && msg[i] != ',' && msg[i] != '}' && !isBlank(msg[i]) {
				i++
			}
		}
		if i = skipBlanks(msg, i); i >= len(msg) || msg[i] != ',' {
			break
		}
		i = skipBlanks(msg, i+1)
	}
	if len(id) == 0 {
		return nil
	}
	return id
}

// keyIsID reports whether the quoted member name key is "id" as
// encoding/json matches names: after unescaping, case-insensitively.
func keyIsID(key []byte) bool {
	end, escaped, err := jsonlex.ScanString(key, 0)
	if err.Failed() || end != len(key) {
		return false
	}
	name := key[1 : len(key)-1]
	if escaped {
		name = ndjson.Field{Start: 1, End: len(key) - 1, Escaped: true}.AppendValue(nil, key)
	}
	return bytes.EqualFold(name, []byte("id"))
}

// isBlank is JSON whitespace, raw line breaks included: the scanner
// refuses those in client messages, and the walk goes past them.
func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipBlanks(b []byte, i int) int {
	for i < len(b) && isBlank(b[i]) {
		i++
	}
	return i
}

// skipString returns the offset just past the string whose opening quote
// is b[i], honouring backslash escapes and nothing else; past the end of b
// (len(b)+1) when it is not closed.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b) + 1
}

// skipNested returns the offset just past the object or array that opens
// at b[i], matching brackets by count alone (the message is refused
// anyway; only where the top level goes on matters), or len(b) when it is
// not closed.
func skipNested(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			i = skipString(b, i)
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return i + 1
			}
		}
		i++
	}
	return len(b)
}
