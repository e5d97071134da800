package mailbox

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
	"unicode/utf8"

	"edgerelay/store"
)

// fuzzApps builds the apps map the way NewHandler does: ParseApps, then a
// pointer to a copy of each App.
func fuzzApps(t testing.TB) map[string]*App {
	t.Helper()
	parsed, err := ParseApps("notes; chat:push=com.example.chat,signal,ice")
	if err != nil {
		t.Fatal(err)
	}
	apps := make(map[string]*App, len(parsed))
	for name, a := range parsed {
		apps[name] = &a
	}
	return apps
}

// rebuildPath writes the canonical path of a parsed route.
func rebuildPath(r route) string {
	p := "/v1/" + r.app.Name + "/mailbox/" + string(r.id)
	switch r.kind {
	case routeMailbox:
	case routeDirection:
		p += "/" + dirName(r.dir)
	case routeEnvelope:
		p += "/" + dirName(r.dir) + "/" + strconv.FormatUint(r.seq, 10)
	case routeWatch:
		p += "/" + dirName(r.dir) + "/watch"
	case routePush:
		p += "/" + dirName(r.dir) + "/push"
	case routeSignal:
		if r.side == 'p' {
			p += "/signal/primary"
		} else {
			p += "/signal/companion"
		}
	case routeICE:
		p += "/ice"
	}
	return p
}

func sameRoute(a, b route) bool {
	return a.kind == b.kind && a.app == b.app && bytes.Equal(a.id, b.id) &&
		a.dir == b.dir && a.seq == b.seq && a.side == b.side
}

func FuzzParsePath(f *testing.F) {
	const id = "abcdefghijklmnop"
	for _, s := range []string{
		"/v1/notes/mailbox/" + id,
		"/v1/notes/mailbox/" + id + "/p2c",
		"/v1/notes/mailbox/" + id + "/c2p/1",
		"/v1/notes/mailbox/" + id + "/c2p/18446744073709551615",
		"/v1/notes/mailbox/" + id + "/c2p/18446744073709551616",
		"/v1/notes/mailbox/" + id + "/p2c/007",
		"/v1/notes/mailbox/" + id + "/p2c/0",
		"/v1/chat/mailbox/" + id + "/p2c/watch",
		"/v1/chat/mailbox/" + id + "/c2p/push",
		"/v1/chat/mailbox/" + id + "/signal/primary",
		"/v1/chat/mailbox/" + id + "/signal/companion",
		"/v1/chat/mailbox/" + id + "/ice",
		"/v1/chat/mailbox/" + id + "/ice/",
		"/v1/chat/mailbox/short",
		"/v1/other/mailbox/" + id,
		"/v1/notes/mailbox/" + id + "/p2c/1/x",
		"/v1/",
		"/v1//mailbox//",
		"",
	} {
		f.Add(s)
	}
	apps := fuzzApps(f)
	f.Fuzz(func(t *testing.T, path string) {
		r, problem := parsePath([]byte(path), apps)
		if problem != pathOK {
			if problem != pathNotFound && problem != pathBad {
				t.Fatalf("parsePath(%q): unknown problem %d", path, problem)
			}
			return
		}
		if r.app == nil {
			t.Fatalf("parsePath(%q): ok with nil app", path)
		}
		if apps[r.app.Name] != r.app {
			t.Fatalf("parsePath(%q): app %q not from the map", path, r.app.Name)
		}
		if !validID(r.id) {
			t.Fatalf("parsePath(%q): ok with invalid id %q", path, r.id)
		}
		switch r.kind {
		case routeDirection, routeEnvelope, routeWatch, routePush:
			if r.dir != store.DirP2C && r.dir != store.DirC2P {
				t.Fatalf("parsePath(%q): direction route with dir %q", path, r.dir)
			}
		case routeMailbox, routeSignal, routeICE:
			if r.dir != 0 {
				t.Fatalf("parsePath(%q): kind %d with dir %q", path, r.kind, r.dir)
			}
		default:
			t.Fatalf("parsePath(%q): unknown kind %d", path, r.kind)
		}
		if (r.kind == routeEnvelope) != (r.seq >= 1) {
			t.Fatalf("parsePath(%q): kind %d with seq %d", path, r.kind, r.seq)
		}
		if (r.kind == routeSignal) != (r.side == 'p' || r.side == 'c') || (r.kind != routeSignal && r.side != 0) {
			t.Fatalf("parsePath(%q): kind %d with side %q", path, r.kind, r.side)
		}
		again := rebuildPath(r)
		if again != path {
			// Only one spelling of each route is accepted.
			t.Fatalf("parsePath(%q) accepted a non-canonical path; canonical %q", path, again)
		}
		r2, problem2 := parsePath([]byte(again), apps)
		if problem2 != pathOK || !sameRoute(r, r2) {
			t.Fatalf("parsePath(%q) = %+v; rebuilt %q parses to %+v, %d", path, r, again, r2, problem2)
		}
	})
}

func FuzzParseSeq(f *testing.F) {
	for _, s := range []string{"0", "1", "9", "10", "007", "00", "-1", "+1", " 1", "1 ",
		"18446744073709551615", "18446744073709551616", "99999999999999999999",
		"000000000000000000001", "1e3", "0x10", ""} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, s string, zeroOK bool) {
		v, ok := parseSeq([]byte(s), zeroOK)
		ref, err := strconv.ParseUint(s, 10, 64)
		// strconv accepts the canonical decimal spellings of a uint64 and
		// also leading zeros and '_' never (base 10 without prefix), so the
		// reference is: ParseUint succeeds and s is canonical.
		refOK := err == nil && strconv.FormatUint(ref, 10) == s && (ref >= 1 || zeroOK)
		if ok != refOK {
			t.Fatalf("parseSeq(%q, %v) = %d, %v; reference %d, %v (err %v)", s, zeroOK, v, ok, ref, refOK, err)
		}
		if !ok {
			if v != 0 {
				t.Fatalf("parseSeq(%q, %v) refused with value %d", s, zeroOK, v)
			}
			return
		}
		if v != ref || strconv.FormatUint(v, 10) != s {
			t.Fatalf("parseSeq(%q, %v) = %d: not the canonical spelling", s, zeroOK, v)
		}
		if v == 0 && !zeroOK {
			t.Fatalf("parseSeq(%q, false) accepted 0", s)
		}
	})
}

func checkRegistration(t *testing.T, body []byte, r registration) {
	t.Helper()
	if !validService(r.Service) || !validTag(r.Tag) {
		t.Fatalf("parseRegistration(%q): bad service %q or tag %q", body, r.Service, r.Tag)
	}
	if utf8.RuneCountInString(r.Alert) > maxAlertChars {
		t.Fatalf("parseRegistration(%q): alert of %d runes", body, utf8.RuneCountInString(r.Alert))
	}
	switch r.Service {
	case "apns":
		if len(r.Token) < 64 || len(r.Token) > 200 || len(r.Token)%2 != 0 {
			t.Fatalf("parseRegistration(%q): apns token length %d", body, len(r.Token))
		}
		for _, c := range []byte(r.Token) {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				t.Fatalf("parseRegistration(%q): apns token not lowercase hex", body)
			}
		}
		if r.Environment != "production" && r.Environment != "development" {
			t.Fatalf("parseRegistration(%q): environment %q", body, r.Environment)
		}
		if r.Other != nil {
			t.Fatalf("parseRegistration(%q): apns with other fields", body)
		}
	case "fcm":
		if len(r.Token) < 32 || len(r.Token) > 1024 {
			t.Fatalf("parseRegistration(%q): fcm token length %d", body, len(r.Token))
		}
		for _, c := range []byte(r.Token) {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c == ':' || c == '-') {
				t.Fatalf("parseRegistration(%q): fcm token charset", body)
			}
		}
		if r.Environment != "" || r.Other != nil {
			t.Fatalf("parseRegistration(%q): fcm with environment or other fields", body)
		}
	default:
		if r.Token != "" || r.Environment != "" {
			t.Fatalf("parseRegistration(%q): generic with token/environment outside Other", body)
		}
		if len(r.Other) > maxGenericFields {
			t.Fatalf("parseRegistration(%q): %d generic fields", body, len(r.Other))
		}
		for k, v := range r.Other {
			if utf8.RuneCountInString(k) > maxGenericValue || utf8.RuneCountInString(v) > maxGenericValue {
				t.Fatalf("parseRegistration(%q): generic field %q too long", body, k)
			}
			if k == "service" || k == "tag" || k == "alert" {
				t.Fatalf("parseRegistration(%q): reserved member %q in Other", body, k)
			}
		}
	}
}

// normOther makes an empty Other nil: omitempty drops it when sealing.
func normOther(r registration) registration {
	if len(r.Other) == 0 {
		r.Other = nil
	}
	return r
}

func FuzzParseRegistration(f *testing.F) {
	apnsTok := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, s := range []string{
		`{"service":"apns","tag":"t1","token":"` + apnsTok + `"}`,
		`{"service":"apns","tag":"t1","token":"` + apnsTok + `","environment":"development","alert":"hi"}`,
		`{"service":"apns","tag":"t1","token":"` + apnsTok + `","environment":"staging"}`,
		`{"service":"apns","tag":"t1","token":"` + apnsTok + `0"}`,
		`{"service":"apns","tag":"t1","token":"` + apnsTok + `","extra":1}`,
		`{"service":"fcm","tag":"T_-9","token":"abc:DEF_ghi-jkl:0123456789abcdefghij"}`,
		`{"service":"fcm","tag":"x","token":"short"}`,
		`{"service":"ntfy","tag":"x","topic":"abc","url":"https://n.example/"}`,
		`{"service":"ntfy","tag":"x","a":"1","b":"2","c":"3","d":"4","e":"5","f":"6","g":"7","h":"8","i":"9"}`,
		`{"service":"ntfy","tag":"x","n":1}`,
		`{"service":"ntfy","tag":"x","alert":"\u00e9\ud83d\ude00","k":"\ud800"}`,
		`{"service":"9bad","tag":"x"}`,
		`{"service":"apns","tag":"x","service":"fcm"}`,
		`{"service":"ntfy","tag":"x","alert":null}`,
		`null`,
		`[]`,
		`{}`,
		"{\"service\":\"ntfy\",\"tag\":\"x\",\"k\":\"\xff\xfe\"}",
	} {
		f.Add([]byte(s))
	}
	bearer := []byte("fuzz-bearer-token-0123456789")
	id := []byte("abcdefghijklmnop")
	f.Fuzz(func(t *testing.T, body []byte) {
		r, ok := parseRegistration(body)
		if !ok {
			return
		}
		checkRegistration(t, body, r)

		// What is sealed at rest opens to the same registration.
		aead, err := sealKey(bearer, id, store.DirC2P)
		if err != nil {
			t.Fatal(err)
		}
		sealed, err := seal(aead, r)
		if err != nil {
			t.Fatalf("seal(%+v): %v", r, err)
		}
		back, err := open(aead, sealed)
		if err != nil {
			t.Fatalf("open(seal(%+v)): %v", r, err)
		}
		if !reflect.DeepEqual(normOther(r), normOther(back)) {
			t.Fatalf("seal/open of %q: %+v became %+v", body, r, back)
		}
		// Another direction's key cannot open it.
		other, err := sealKey(bearer, id, store.DirP2C)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := open(other, sealed); err == nil {
			t.Fatalf("registration sealed for c2p opened with the p2c key")
		}

		// The registration re-encoded as a request body parses to itself.
		flat := map[string]string{"service": r.Service, "tag": r.Tag}
		if r.Alert != "" {
			flat["alert"] = r.Alert
		}
		if r.Token != "" {
			flat["token"] = r.Token
		}
		if r.Environment != "" {
			flat["environment"] = r.Environment
		}
		for k, v := range r.Other {
			flat[k] = v
		}
		again, err := json.Marshal(flat)
		if err != nil {
			t.Fatal(err)
		}
		r2, ok := parseRegistration(again)
		if !ok {
			t.Fatalf("parseRegistration(%q) accepted %+v, but not its re-encoding %q", body, r, again)
		}
		if !reflect.DeepEqual(normOther(r), normOther(r2)) {
			t.Fatalf("parseRegistration(%q) = %+v; re-encoded %q gives %+v", body, r, again, r2)
		}
	})
}

func refValidBearer(tok []byte) bool {
	if len(tok) < 16 || len(tok) > 256 {
		return false
	}
	const allowed = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/="
	for _, c := range tok {
		if !bytes.ContainsRune([]byte(allowed), rune(c)) || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func FuzzValidBearer(f *testing.F) {
	for _, s := range []string{
		"0123456789abcdef",
		"0123456789abcde",
		"A-Za-z0-9._~+/==xx",
		"0123456789abcdef ",
		"0123456789abcdef\x00",
		"0123456789abcdef\xff",
		"0123456789abcdef:",
		string(bytes.Repeat([]byte("a"), 256)),
		string(bytes.Repeat([]byte("a"), 257)),
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, tok []byte) {
		if got, want := validBearer(tok), refValidBearer(tok); got != want {
			t.Fatalf("validBearer(%q) = %v, want %v", tok, got, want)
		}
	})
}
