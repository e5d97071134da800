package pushgw

import (
	"bytes"
	"errors"
	"sort"
	"unicode/utf8"
)

// The /send and /register bodies are read with a hand-written JSON parser
// rather than encoding/json, for three reasons: the answer must be the
// reference's (JSON.parse's) verdict, field by field and in the table's
// order, which needs each field's JSON type before any conversion; the
// limits count UTF-16 code units of the decoded text; and the send path
// should not allocate per field. The parser validates the whole document
// first (any syntax error is "invalid json body", whatever the fields
// say), decoding strings into the scratch arena as it goes.

// Limits of POST /send, in UTF-16 code units.
const (
	maxToken      = 512
	maxTitle      = 256
	maxBody       = 1024
	maxDataValue  = 1024
	maxDataKey    = 64
	maxDataFields = 16
	maxLabel      = 64
)

// Messages of the 400 answers, in the order the checks run.
const (
	errInvalidJSON   = "invalid json body"
	errUnreadable    = "could not read request body" // the body's stream broke (a malformed chunk, a reset)
	errMissingToken  = "missing token"
	errInvalidToken  = "invalid token"
	errInvalidTitle  = "invalid title"
	errInvalidBody   = "invalid body"
	errInvalidData   = "invalid data"
	errTooManyData   = "too many data entries"
	errInvalidDataK  = "invalid data key"
	errInvalidDataV  = "invalid data value"
	defaultLabelText = "self-registered"
)

// jsonKind is the type of a JSON value.
type jsonKind uint8

const (
	kindNone jsonKind = iota // absent
	kindNull
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

// span is a decoded string: arena[start:end].
type span struct{ start, end int }

// value is one parsed member value: its kind, its decoded text when a
// string, and where it lies in the input (to walk an object again).
type value struct {
	kind     jsonKind
	str      span
	from, to int
}

// entry is one data entry. key and val are arena spans; valKind is the
// type of the (last) value given for the key.
type entry struct {
	key, val span
	valKind  jsonKind
	index    uint32 // its array index, when isIndex
	isIndex  bool
}

// sendMessage is a validated /send body: slices into the scratch arena,
// valid until the scratch goes back to the pool.
type sendMessage struct {
	token, title, body []byte
	data               []dataEntry // in JavaScript property order
}

// dataEntry is one data entry, its value clipped.
type dataEntry struct{ key, val []byte }

var errSyntax = errors.New("pushgw: invalid JSON")

// parser reads one JSON document, decoding strings into arena.
type parser struct {
	in    []byte
	pos   int
	arena []byte
}

func (p *parser) reset(in []byte, arena []byte) {
	// A UTF-8 byte order mark is dropped, as the reference's text decoding
	// drops it before JSON.parse sees the text.
	p.in = bytes.TrimPrefix(in, []byte("\xef\xbb\xbf"))
	p.pos = 0
	p.arena = arena[:0]
}

func (p *parser) text(s span) []byte { return p.arena[s.start:s.end] }

func (p *parser) skipWS() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// topObject parses the document, which must be one object, calling member
// for each of its members in order.
func (p *parser) topObject(member func(key span, v value)) error {
	p.skipWS()
	if p.pos >= len(p.in) || p.in[p.pos] != '{' {
		// Not an object: a scalar, an array, null, nothing. Still invalid
		// JSON if it does not parse, but the answer is the same.
		return errSyntax
	}
	if err := p.object(member); err != nil {
		return err
	}
	p.skipWS()
	if p.pos != len(p.in) {
		return errSyntax
	}
	return nil
}

// object parses an object at p.pos, calling member (when not nil) for
// each member. Keys are decoded into the arena; a caller that needs no
// key text lets the arena shrink back (see value).
func (p *parser) object(member func(key span, v value)) error {
	p.pos++ // '{'
	p.skipWS()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return nil
	}
	for {
		p.skipWS()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return errSyntax
		}
		mark := len(p.arena)
		key, err := p.str()
		if err != nil {
			return err
		}
		p.skipWS()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return errSyntax
		}
		p.pos++
		v, err := p.value(member != nil)
		if err != nil {
			return err
		}
		if member != nil {
			member(key, v)
		} else {
			p.arena = p.arena[:mark]
		}
		p.skipWS()
		if p.pos >= len(p.in) {
			return errSyntax
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return nil
		default:
			return errSyntax
		}
	}
}

// value parses any value at p.pos. keep decides whether a string value's
// text stays in the arena; nested values never keep theirs.
func (p *parser) value(keep bool) (value, error) {
	p.skipWS()
	if p.pos >= len(p.in) {
		return value{}, errSyntax
	}
	v := value{from: p.pos}
	var err error
	switch c := p.in[p.pos]; {
	case c == '{':
		v.kind = kindObject
		err = p.object(nil)
	case c == '[':
		v.kind = kindArray
		err = p.array()
	case c == '"':
		v.kind = kindString
		mark := len(p.arena)
		v.str, err = p.str()
		if !keep {
			p.arena = p.arena[:mark]
			v.str = span{}
		}
	case c == 't':
		v.kind = kindBool
		err = p.literal("true")
	case c == 'f':
		v.kind = kindBool
		err = p.literal("false")
	case c == 'n':
		v.kind = kindNull
		err = p.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		v.kind = kindNumber
		err = p.number()
	default:
		err = errSyntax
	}
	v.to = p.pos
	return v, err
}

func (p *parser) array() error {
	p.pos++ // '['
	p.skipWS()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return nil
	}
	for {
		if _, err := p.value(false); err != nil {
			return err
		}
		p.skipWS()
		if p.pos >= len(p.in) {
			return errSyntax
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return nil
		default:
			return errSyntax
		}
	}
}

func (p *parser) literal(word string) error {
	if !bytes.HasPrefix(p.in[p.pos:], []byte(word)) {
		return errSyntax
	}
	p.pos += len(word)
	return nil
}

// number checks JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *parser) number() error {
	in := p.in
	i := p.pos
	if in[i] == '-' {
		i++
	}
	digits := func() int {
		start := i
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
		return i - start
	}
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case digits() == 0:
		return errSyntax
	}
	if i < len(in) && in[i] == '.' {
		i++
		if digits() == 0 {
			return errSyntax
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		if digits() == 0 {
			return errSyntax
		}
	}
	p.pos = i
	return nil
}

// str decodes the string at p.pos into the arena. Invalid UTF-8 becomes
// U+FFFD per maximal invalid subsequence (the WHATWG decoder's rule), and
// so does a \u escape of a lone surrogate.
func (p *parser) str() (span, error) {
	in := p.in
	i := p.pos + 1 // past '"'
	s := span{start: len(p.arena)}
	for {
		// Copy a run of plain bytes at once.
		run := i
		for i < len(in) {
			c := in[i]
			if c == '"' || c == '\\' || c < 0x20 || c >= 0x80 {
				break
			}
			i++
		}
		p.arena = append(p.arena, in[run:i]...)
		if i >= len(in) {
			return span{}, errSyntax
		}
		c := in[i]
		switch {
		case c == '"':
			p.pos = i + 1
			s.end = len(p.arena)
			return s, nil
		case c < 0x20:
			return span{}, errSyntax
		case c == '\\':
			n, err := p.escape(i)
			if err != nil {
				return span{}, err
			}
			i += n
		default:
			r, size := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && size <= 1 {
				p.arena = utf8.AppendRune(p.arena, utf8.RuneError)
				i += invalidLen(in[i:])
				continue
			}
			p.arena = append(p.arena, in[i:i+size]...)
			i += size
		}
	}
}

// escape decodes the escape sequence at in[i] ('\\') and returns its
// length in the input.
func (p *parser) escape(i int) (int, error) {
	in := p.in
	if i+1 >= len(in) {
		return 0, errSyntax
	}
	var b byte
	switch in[i+1] {
	case '"':
		b = '"'
	case '\\':
		b = '\\'
	case '/':
		b = '/'
	case 'b':
		b = '\b'
	case 'f':
		b = '\f'
	case 'n':
		b = '\n'
	case 'r':
		b = '\r'
	case 't':
		b = '\t'
	case 'u':
		r, ok := hex4(in[i+2:])
		if !ok {
			return 0, errSyntax
		}
		n := 6
		switch {
		case r >= 0xD800 && r < 0xDC00:
			// A high surrogate: a pair only when a low one follows.
			if len(in) >= i+12 && in[i+6] == '\\' && in[i+7] == 'u' {
				if lo, ok := hex4(in[i+8:]); ok && lo >= 0xDC00 && lo < 0xE000 {
					r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
					n = 12
				} else {
					r = utf8.RuneError
				}
			} else {
				r = utf8.RuneError
			}
		case r >= 0xDC00 && r < 0xE000:
			r = utf8.RuneError
		}
		p.arena = utf8.AppendRune(p.arena, r)
		return n, nil
	default:
		return 0, errSyntax
	}
	p.arena = append(p.arena, b)
	return 2, nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

// invalidLen is the length of the maximal invalid subsequence at the start
// of b (which does not start a valid rune): a lead byte and the
// continuation bytes that could still have completed it. It is at least 1.
func invalidLen(b []byte) int {
	c := b[0]
	lo, hi := byte(0x80), byte(0xBF)
	need := 0
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c == 0xED:
		need, hi = 2, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		need = 2
	case c == 0xF0:
		need, lo = 3, 0x90
	case c == 0xF4:
		need, hi = 3, 0x8F
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	default:
		return 1
	}
	n := 1
	for ; n <= need && n < len(b); n++ {
		if b[n] < lo || b[n] > hi {
			break
		}
		lo, hi = 0x80, 0xBF
	}
	return n
}

// parseSend validates a /send body and fills msg. It returns "" or the
// message of the first failing check, in the order of the spec's table:
// token, title, body, data (and within data: its type, the entry count,
// then each entry's key and value in property order).
func (p *parser) parseSend(in []byte, entries []entry, msg *sendMessage) ([]entry, string) {
	p.reset(in, p.arena)
	var token, title, body, data value
	err := p.topObject(func(key span, v value) {
		// Duplicate members: the last one wins, as in JSON.parse.
		switch string(p.text(key)) {
		case "token":
			token = v
		case "title":
			title = v
		case "body":
			body = v
		case "data":
			data = v
		}
	})
	if err != nil {
		return entries, errInvalidJSON
	}

	// token: required string, trimmed, at most maxToken; never clipped.
	// The reference refuses any present value that is not a string, null
	// included (raw.token !== undefined && typeof raw.token !== "string");
	// only an absent token is "missing".
	switch token.kind {
	case kindNone:
		return entries, errMissingToken
	case kindString:
	default:
		return entries, errInvalidToken
	}
	tok := jsTrim(p.text(token.str))
	if len(tok) == 0 {
		return entries, errMissingToken
	}
	if utf16Len(tok) > maxToken {
		return entries, errInvalidToken
	}

	t, ok := optionalString(p, title, maxTitle)
	if !ok {
		return entries, errInvalidTitle
	}
	b, ok := optionalString(p, body, maxBody)
	if !ok {
		return entries, errInvalidBody
	}

	entries = entries[:0]
	switch data.kind {
	case kindNone, kindNull: // data alone reads null as {}, as the reference does
	case kindObject:
		var emsg string
		if entries, emsg = p.dataEntries(data, entries); emsg != "" {
			return entries, emsg
		}
	default:
		return entries, errInvalidData
	}

	msg.token, msg.title, msg.body = tok, t, b
	msg.data = msg.data[:0]
	for _, e := range entries {
		msg.data = append(msg.data, dataEntry{key: p.text(e.key), val: clip16(p.text(e.val), maxDataValue)})
	}
	return entries, ""
}

// optionalString reads an optional string member: absent is "", a string
// is clipped to max, anything else is refused, null included (the
// reference tests raw[field] !== undefined, and null is not undefined).
func optionalString(p *parser, v value, max int) ([]byte, bool) {
	switch v.kind {
	case kindNone:
		return nil, true
	case kindString:
		return clip16(p.text(v.str), max), true
	}
	return nil, false
}

// dataEntries walks the data object again, now keeping its keys and
// values, and checks it. Keys given twice keep their first position and
// their last value, as in a JavaScript object.
func (p *parser) dataEntries(data value, entries []entry) ([]entry, string) {
	sub := parser{in: p.in[:data.to], pos: data.from, arena: p.arena}
	tooMany := false
	// The object already parsed once, so this walk cannot fail.
	_ = sub.object(func(key span, v value) {
		if tooMany {
			return
		}
		k := sub.text(key)
		for i := range entries {
			if bytes.Equal(sub.text(entries[i].key), k) {
				entries[i].val, entries[i].valKind = v.str, v.kind
				return
			}
		}
		if len(entries) == maxDataFields {
			// A 17th distinct key: the answer is decided, and deduping
			// the rest would only cost time.
			tooMany = true
			return
		}
		idx, isIdx := arrayIndex(k)
		entries = append(entries, entry{key: key, val: v.str, valKind: v.kind, index: idx, isIndex: isIdx})
	})
	p.arena = sub.arena
	if tooMany {
		return entries, errTooManyData
	}
	sort.SliceStable(entries, func(i, j int) bool {
		a, b := &entries[i], &entries[j]
		if a.isIndex != b.isIndex {
			return a.isIndex
		}
		return a.isIndex && a.index < b.index
	})
	for _, e := range entries {
		if utf16Len(p.text(e.key)) > maxDataKey {
			return entries, errInvalidDataK
		}
		if e.valKind != kindString {
			return entries, errInvalidDataV
		}
	}
	return entries, ""
}

// parseLabel reads the label of a /register body. Anything unparseable is
// read as {}: the label is then the default. A label is trimmed and
// clipped to maxLabel code units; empty means the default.
func (p *parser) parseLabel(in []byte) []byte {
	p.reset(in, p.arena)
	var label value
	if err := p.topObject(func(key span, v value) {
		if string(p.text(key)) == "label" {
			label = v
		}
	}); err != nil || label.kind != kindString {
		return []byte(defaultLabelText)
	}
	l := clip16(jsTrim(p.text(label.str)), maxLabel)
	if len(l) == 0 {
		return []byte(defaultLabelText)
	}
	return l
}
