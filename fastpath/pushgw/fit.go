package pushgw

// Provider size limits. Beyond the reference, which forwards what it was
// given: KyPost's new-mail push repeats the subject in several data
// values, so a long subject (700 characters) makes an APNs payload past
// Apple's 4,096 bytes (413 PayloadTooLarge, a lost notification), and
// FCM's data limit is 4 KB too. A notification clipped further is better
// than none, the reference's own reason for clipping titles and bodies.
const (
	// apnsMaxPayload is Apple's limit on the payload of every push type
	// but VoIP, in bytes.
	apnsMaxPayload = 4096
	// fcmMaxData bounds the "data" object of an FCM message, measured as
	// its JSON text (braces, quotes, escapes and all): stricter than FCM's
	// own count over keys and values, so whatever fits here fits there.
	fcmMaxData = 4096
)

// clipping records a payload that had to be clipped to fit, for the log.
type clipping struct {
	from, to, limit int // bytes of the measured part, before and after; its limit
}

// jsonLen is the length of s written by appendJSONString, quotes included.
func jsonLen(s []byte) int {
	n := 2
	for _, c := range s {
		n += escapedLen(c)
	}
	return n
}

// escapedLen is the length of byte c in a string written by
// appendJSONString (jsonstr.AppendRaw): '"', '\\' and the five named
// controls take two bytes, other controls six (\u00xx), the rest one.
func escapedLen(c byte) int {
	switch {
	case c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t':
		return 2
	case c < 0x20:
		return 6
	}
	return 1
}

// clipJSON returns the longest prefix of s that ends on a rune boundary and
// whose JSON text (quotes excluded) takes at most max bytes. A rune outside
// the BMP is kept or dropped whole, so no surrogate pair is split.
func clipJSON(s []byte, max int) []byte { return clipRunes(s, max, jsonRuneLen) }

// jsonRuneLen is the length of rune r written by appendJSONString.
func jsonRuneLen(r []byte) int {
	n := 0
	for _, c := range r {
		n += escapedLen(c)
	}
	return n
}

// clipRunes returns the longest prefix of s that ends on a rune boundary
// and whose runes cost at most max in all; cost measures one rune's bytes.
func clipRunes(s []byte, max int, cost func(r []byte) int) []byte {
	n := 0
	for i := 0; i < len(s); {
		size := min(runeLen(s[i]), len(s)-i) // a cut sequence costs what is there
		w := cost(s[i : i+size])
		if n+w > max {
			return s[:i]
		}
		n += w
		i += size
	}
	return s
}

// runeLen is the length of the UTF-8 sequence that starts with c; the
// parser's strings are valid UTF-8.
func runeLen(c byte) int {
	switch {
	case c >= 0xF0:
		return 4
	case c >= 0xE0:
		return 3
	case c >= 0xC0:
		return 2
	}
	return 1
}

// fit clips msg until size(msg) <= limit: first the longest data values
// (all of them cut to one common length, the largest that makes enough
// room), then the body, then the title. skip names data entries the
// payload leaves out (they make no room). It reports what it did, or nil
// when msg fit already. If even empty texts leave it over the limit (data
// keys alone too long), msg goes out as small as it got and the provider
// decides.
func fit(msg *sendMessage, limit int, size func(*sendMessage) int, skip func(key []byte) bool, clipText bool) *clipping {
	from := size(msg)
	if from <= limit {
		return nil
	}
	excess := from - limit
	// The common cap, by bisection over the longest value's length: the
	// largest cap whose cuts free at least excess bytes.
	longest := 0
	for _, e := range msg.data {
		if !skip(e.key) {
			longest = max(longest, jsonLen(e.val)-2)
		}
	}
	freed := func(limit int) int {
		n := 0
		for _, e := range msg.data {
			if l := jsonLen(e.val) - 2; !skip(e.key) && l > limit {
				n += l - limit
			}
		}
		return n
	}
	lo, hi := 0, longest // freed(hi) == 0; find the largest cap with freed >= excess
	if freed(0) <= excess {
		hi = 0
	} else {
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if freed(mid) >= excess {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		hi = lo
	}
	for i := range msg.data {
		if !skip(msg.data[i].key) {
			msg.data[i].val = clipJSON(msg.data[i].val, hi)
		}
	}
	if clipText {
		if over := size(msg) - limit; over > 0 {
			msg.body = clipJSON(msg.body, max(0, jsonLen(msg.body)-2-over))
		}
		if over := size(msg) - limit; over > 0 {
			msg.title = clipJSON(msg.title, max(0, jsonLen(msg.title)-2-over))
		}
	}
	return &clipping{from: from, to: size(msg), limit: limit}
}

// apnsPayloadLen is the length of appendAPNsPayload's output.
func apnsPayloadLen(msg *sendMessage, category string) int {
	n := len(`{`)
	for _, e := range msg.data {
		if !apnsSkips(e.key) {
			n += jsonLen(e.key) + 1 + jsonLen(e.val) + 1
		}
	}
	n += len(`"aps":{"alert":{"title":`) + jsonLen(msg.title) + len(`,"body":`) + jsonLen(msg.body)
	return n + len(`},"sound":"default","mutable-content":1,"category":"`) + len(category) + len(`"}}`)
}

// fcmDataLen is the length of the "data" object appendFCMMessage writes.
func fcmDataLen(msg *sendMessage) int {
	n := len(`{}`)
	for i, e := range msg.data {
		if i > 0 {
			n++
		}
		n += jsonLen(e.key) + 1 + jsonLen(e.val)
	}
	return n
}

// apnsSkips names the data entries the APNs payload leaves out: "aps" is
// written last by the gateway, so data cannot replace it.
func apnsSkips(key []byte) bool { return string(key) == "aps" }

func skipNone([]byte) bool { return false }
