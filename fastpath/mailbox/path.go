package mailbox

import "bytes"

// routeKind is what a path addresses.
type routeKind uint8

const (
	routeMailbox   routeKind = iota + 1 // /v1/<app>/mailbox/<id>
	routeDirection                      // …/<dir>
	routeEnvelope                       // …/<dir>/<seq>
	routeWatch                          // …/<dir>/watch
	routePush                           // …/<dir>/push
	routeSignal                         // …/signal/<side>
	routeICE                            // …/ice
)

// route is a parsed request path. id aliases the request's path bytes.
type route struct {
	kind routeKind
	app  *App
	id   []byte
	dir  byte // store.DirP2C or store.DirC2P
	seq  uint64
	side byte // 'p' primary, 'c' companion
}

// parseProblem says why a path is refused: 404 for a path that names
// nothing, 400 for a malformed parameter in a path that does.
type parseProblem uint8

const (
	pathOK parseProblem = iota
	pathNotFound
	pathBad
)

// parsePath splits /v1/<app>/mailbox/<id>[/…] without allocating.
func parsePath(p []byte, apps map[string]*App) (route, parseProblem) {
	var r route
	rest, ok := bytes.CutPrefix(p, []byte("/v1/"))
	if !ok {
		return r, pathNotFound
	}
	var seg [5][]byte
	n := 0
	for len(rest) > 0 || n == 0 {
		if n == len(seg) {
			return r, pathNotFound
		}
		i := bytes.IndexByte(rest, '/')
		if i < 0 {
			seg[n], rest = rest, nil
		} else {
			seg[n], rest = rest[:i], rest[i+1:]
			if len(rest) == 0 { // a trailing slash names nothing
				return r, pathNotFound
			}
		}
		n++
	}
	if n < 3 || string(seg[1]) != "mailbox" {
		return r, pathNotFound
	}
	app := apps[string(seg[0])]
	if app == nil {
		return r, pathNotFound
	}
	r.app, r.id = app, seg[2]
	switch {
	case n == 3:
		r.kind = routeMailbox
	case string(seg[3]) == "p2c" || string(seg[3]) == "c2p":
		r.dir = seg[3][0]
		switch {
		case n == 4:
			r.kind = routeDirection
		case n > 5:
			return r, pathNotFound
		case string(seg[4]) == "watch":
			r.kind = routeWatch
		case string(seg[4]) == "push":
			r.kind = routePush
		default:
			seq, ok := parseSeq(seg[4], false)
			if !ok {
				return r, pathBad
			}
			r.kind, r.seq = routeEnvelope, seq
		}
	case string(seg[3]) == "signal" && n == 5 && (string(seg[4]) == "primary" || string(seg[4]) == "companion"):
		r.kind, r.side = routeSignal, seg[4][0]
	case string(seg[3]) == "ice" && n == 4:
		r.kind = routeICE
	default:
		return r, pathNotFound
	}
	if !validID(r.id) {
		return r, pathBad
	}
	return r, pathOK
}

// validID: 16 to 64 of A-Z a-z 0-9 _ -.
func validID(id []byte) bool {
	return len(id) >= 16 && len(id) <= 64 && allIn(&idBytes, id)
}

// idBytes and bearerBytes are the bytes a mailbox id and a bearer may
// hold, as tables: one load per byte instead of a chain of range checks
// (a third of a HEAD's path and bearer checks). Read-only after init.
var (
	idBytes     = byteSet("_-")
	bearerBytes = byteSet("-._~+/=")
)

// byteSet is A-Z a-z 0-9 and extra.
func byteSet(extra string) (set [256]bool) {
	for c := range 256 {
		set[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	for i := range len(extra) {
		set[extra[i]] = true
	}
	return set
}

// allIn reports whether every byte of b is in set.
func allIn(set *[256]bool, b []byte) bool {
	for _, c := range b {
		if !set[c] {
			return false
		}
	}
	return true
}

// parseSeq reads a decimal sequence: 1 to 2^64-1, or 0 too when zeroOK
// (after, through). No sign, no leading zeros beyond "0" itself, no spaces.
func parseSeq(b []byte, zeroOK bool) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 || (len(b) > 1 && b[0] == '0') {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (^uint64(0)-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	if v == 0 && !zeroOK {
		return 0, false
	}
	return v, true
}

// validBearer: 16 to 256 of A-Z a-z 0-9 - . _ ~ + / =.
func validBearer(t []byte) bool {
	return len(t) >= 16 && len(t) <= 256 && allIn(&bearerBytes, t)
}
