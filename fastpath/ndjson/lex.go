package ndjson

import "edgerelay/fastpath/jsonlex"

// The lexer is jsonlex with this package's choices: a line feed is not
// whitespace (a line never holds one, and a message that does would become
// two lines on the link), and values nest at most MaxDepth deep. The helpers
// below map its errors to this package's at the boundary: ErrTooDeep, or
// ErrSyntax for every other one. Each takes the offset where its token
// starts and returns the offset just past it.

// lex is the lexer of a line.
func lex() jsonlex.Lexer { return jsonlex.Lexer{MaxDepth: MaxDepth, NoLineFeed: true} }

const _ uint = jsonlex.DepthLimit - MaxDepth // jsonlex supports MaxDepth

// result is a jsonlex result with this package's error.
func result(end int, e jsonlex.Error) (int, error) {
	switch e.Code {
	case jsonlex.OK:
		return end, nil
	case jsonlex.TooDeep:
		return end, ErrTooDeep
	}
	return end, ErrSyntax
}

// skipWS returns the offset of the first byte at or after i that is not
// whitespace (a line feed is not).
func skipWS(b []byte, i int) int { return lex().SkipWS(b, i) }

// scanString validates the string whose opening quote is b[i] and returns the
// offset just past its closing quote, and whether it holds an escape (if not,
// its bytes are its value). Its bytes must be valid UTF-8 too: a line is
// forwarded to browsers as a WebSocket text message, which must be. Lone
// surrogate escapes are valid JSON and pass here; checkText refuses them in
// envelope fields.
func scanString(b []byte, i int) (end int, escaped bool, err error) {
	end, escaped, e := jsonlex.ScanString(b, i)
	end, err = result(end, e)
	return end, escaped, err
}

// scanLiteral validates that the word (true, false or null) starts at b[i].
func scanLiteral(b []byte, i int, word string) (int, error) {
	return result(jsonlex.ScanLiteral(b, i, word))
}

// scanKey validates the member name starting at b[i] and the colon after it,
// and returns the offset of the member's value.
func scanKey(b []byte, i int) (int, error) { return result(lex().ScanKey(b, i)) }

// skipValue validates the JSON value that starts at b[i] and returns the
// offset just past it. depth is the nesting level an object or array
// starting at b[i] would have; one deeper than MaxDepth is ErrTooDeep.
func skipValue(b []byte, i, depth int) (int, error) { return result(lex().SkipValue(b, i, depth)) }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanUint reads the number starting at b[i] the way encoding/json stores a
// number into a uint64 (strconv.ParseUint(text, 10, 64)): decimal digits
// only, no sign, fraction or exponent, at most 2^64-1. A valid JSON number
// that is not such an integer is ErrSeq: the endpoint's decoder fails on it.
func scanUint(b []byte, i int) (v uint64, end int, err error) {
	start := i
	if b[i] == '0' {
		i++
	} else if b[i] >= '1' && b[i] <= '9' {
		for ; i < len(b) && isDigit(b[i]); i++ {
			d := uint64(b[i] - '0')
			if v > (^uint64(0)-d)/10 {
				return 0, i, ErrSeq
			}
			v = v*10 + d
		}
	} else { // '-'
		if _, e := jsonlex.ScanNumber(b, start); e.Failed() {
			return 0, i, ErrSyntax
		}
		return 0, i, ErrSeq
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		if _, e := jsonlex.ScanNumber(b, start); e.Failed() {
			return 0, i, ErrSyntax
		}
		return 0, i, ErrSeq
	}
	return v, i, nil
}
