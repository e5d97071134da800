package pushtest

import (
	"crypto/ecdsa"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// APNs limits the fake enforces, from Apple's provider API documentation.
const (
	apnsMaxPayload     = 4096 // bytes, every push type but voip
	apnsMaxPayloadVoIP = 5120
	apnsTokenLifetime  = time.Hour // a provider token older than this is expired
	apnsClockSkew      = time.Minute
)

// knownPushType reports whether Apple documents the apns-push-type value.
func knownPushType(t string) bool {
	switch t {
	case "alert", "background", "location", "voip", "complication", "fileprovider",
		"mdm", "liveactivity", "pushtotalk", "widgets", "controls":
		return true
	}
	return false
}

// FakeAPNs is a local APNs provider endpoint: POST /3/device/<token> over
// HTTP/2 with TLS, token-based authentication.
//
// It checks, in Apple's order: the method and path, HTTP/2, the provider
// token (authorization: bearer <JWT>, header alg ES256 and kid = the key
// id, claims iss = the team id and iat within the last hour, signature
// verified with the key's public half), apns-topic (present; equal to the
// one set with RequireTopic, if any), apns-push-type (present and known),
// apns-priority (1, 5 or 10; not 10 on a background push),
// apns-expiration (a number) and the payload (present, within 4 KiB, 5 KiB
// for voip). A request that fails a check gets Apple's status and reason
// for it; one that passes gets the answer programmed for its device token,
// or 200. Every request is recorded, with the answer it got.
type FakeAPNs struct {
	tlsServer
	teamID, keyID string
	pub           *ecdsa.PublicKey

	mu       sync.Mutex
	topic    string                // required apns-topic; "" accepts any
	verified map[string]apnsClaims // provider tokens whose signature checked out
	expired  map[string]bool       // provider tokens declared expired
	answers  answers[apnsAnswer]   // programmed answers by device token
	rec      recorder[APNsRequest]
}

// APNsRequest is one request the fake received, and what it answered.
type APNsRequest struct {
	DeviceToken string      // from the path, unescaped
	Header      http.Header // as received
	Body        []byte      // as received
	Proto       string      // "HTTP/2.0"
	RemoteAddr  string      // the client's address: one per connection
	Bearer      string      // the provider token (JWT), "" if none
	KeyID       string      // the JWT's kid, if it parsed
	IssuedAt    time.Time   // the JWT's iat, if it parsed
	Status      int         // the status the fake answered
	Reason      string      // the reason it answered, "" with 200
	// Problem says why the fake itself refused the request (a failed
	// check), in words for a test failure message; "" when the request
	// passed every check, whatever answer was programmed.
	Problem string
}

// apnsAnswer is a programmed answer.
type apnsAnswer struct {
	status int
	reason string
}

// apnsClaims is the provider token's claims.
type apnsClaims struct {
	Iss string `json:"iss"`
	Iat int64  `json:"iat"`
}

// NewAPNs starts a fake APNs that accepts provider tokens of team teamID
// signed by the key keyID, whose public half is pub. It stops when the test
// ends.
func NewAPNs(t testing.TB, teamID, keyID string, pub *ecdsa.PublicKey) *FakeAPNs {
	t.Helper()
	f := &FakeAPNs{
		teamID:   teamID,
		keyID:    keyID,
		pub:      pub,
		verified: make(map[string]apnsClaims),
		expired:  make(map[string]bool),
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	f.srv = srv
	t.Cleanup(srv.Close)
	return f
}

// RequireTopic makes the fake refuse (400 DeviceTokenNotForTopic) a
// notification whose apns-topic is not topic.
func (f *FakeAPNs) RequireTopic(topic string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.topic = topic
}

// Answer makes every later valid request for deviceToken get status and
// reason (for example 410 "Unregistered", 400 "BadDeviceToken"); 200 with
// reason "" restores success. One-shot answers go first.
func (f *FakeAPNs) Answer(deviceToken string, status int, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers.setSticky(deviceToken, apnsAnswer{status, reason})
}

// AnswerOnce makes the next valid request for deviceToken get status and
// reason; several calls queue answers in order.
func (f *FakeAPNs) AnswerOnce(deviceToken string, status int, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers.setOnce(deviceToken, apnsAnswer{status, reason})
}

// ExpireProviderTokens makes the fake answer 403 ExpiredProviderToken to
// every provider token it has seen so far, as Apple does to a token past its
// hour: a client that keeps sending the same token keeps failing, one that
// mints a fresh token succeeds.
func (f *FakeAPNs) ExpireProviderTokens() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for bearer := range f.verified {
		f.expired[bearer] = true
	}
}

// Requests returns every request received so far, in order.
func (f *FakeAPNs) Requests() []APNsRequest { return f.rec.all() }

// Wait returns the requests once at least n have arrived, or those that
// arrived when timeout passes. For pushes sent asynchronously.
func (f *FakeAPNs) Wait(n int, timeout time.Duration) []APNsRequest { return f.rec.wait(n, timeout) }

func (f *FakeAPNs) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	req := APNsRequest{Header: r.Header.Clone(), Body: body, Proto: r.Proto, RemoteAddr: r.RemoteAddr}
	status, reason := f.check(r, &req)
	if req.Problem == "" {
		f.mu.Lock()
		if a, ok := f.answers.next(req.DeviceToken); ok {
			status, reason = a.status, a.reason
		}
		f.mu.Unlock()
	}
	req.Status, req.Reason = status, reason
	f.rec.add(req)

	id := r.Header.Get("apns-id")
	if id == "" {
		id = newUUID()
	}
	w.Header().Set("apns-id", id)
	if status == http.StatusOK {
		w.WriteHeader(status)
		return
	}
	answer := map[string]any{"reason": reason}
	if status == http.StatusGone {
		answer["timestamp"] = time.Now().UnixMilli()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(answer)
}

// check runs Apple's checks. It returns 200 and leaves req.Problem empty
// when the request passes, or Apple's answer with req.Problem explaining.
func (f *FakeAPNs) check(r *http.Request, req *APNsRequest) (status int, reason string) {
	refuse := func(s int, why, problem string) (int, string) {
		req.Problem = problem
		return s, why
	}
	if r.Method != http.MethodPost {
		return refuse(http.StatusMethodNotAllowed, "MethodNotAllowed", "method "+r.Method+", want POST")
	}
	escaped, ok := strings.CutPrefix(r.URL.EscapedPath(), "/3/device/")
	if !ok || strings.Contains(escaped, "/") {
		return refuse(http.StatusNotFound, "BadPath", "path "+r.URL.EscapedPath()+", want /3/device/<token>")
	}
	token, err := url.PathUnescape(escaped)
	if err != nil {
		return refuse(http.StatusNotFound, "BadPath", "path "+escaped+" is not escaped properly")
	}
	req.DeviceToken = token
	if token == "" {
		return refuse(http.StatusBadRequest, "MissingDeviceToken", "no device token in the path")
	}
	if r.ProtoMajor != 2 {
		return refuse(http.StatusHTTPVersionNotSupported, "", "protocol "+r.Proto+", APNs speaks only HTTP/2")
	}

	if s, why, problem := f.checkProviderToken(r, req); s != http.StatusOK {
		return refuse(s, why, problem)
	}

	f.mu.Lock()
	wantTopic := f.topic
	f.mu.Unlock()
	topic := r.Header.Get("apns-topic")
	switch {
	case topic == "":
		return refuse(http.StatusBadRequest, "MissingTopic", "no apns-topic header")
	case wantTopic != "" && topic != wantTopic:
		return refuse(http.StatusBadRequest, "DeviceTokenNotForTopic", "apns-topic "+topic+", want "+wantTopic)
	}
	pushType := r.Header.Get("apns-push-type")
	if !knownPushType(pushType) {
		return refuse(http.StatusBadRequest, "InvalidPushType", "apns-push-type "+strconv.Quote(pushType)+" is not one Apple knows")
	}
	if p, ok := r.Header["Apns-Priority"]; ok {
		switch {
		case len(p) != 1 || (p[0] != "1" && p[0] != "5" && p[0] != "10"):
			return refuse(http.StatusBadRequest, "BadPriority", "apns-priority "+strings.Join(p, ",")+", want 1, 5 or 10")
		case p[0] == "10" && pushType == "background":
			return refuse(http.StatusBadRequest, "BadPriority", "apns-priority 10 on a background push (Apple requires 5)")
		}
	}
	if e, ok := r.Header["Apns-Expiration"]; ok {
		if _, err := strconv.ParseInt(strings.Join(e, ","), 10, 64); err != nil {
			return refuse(http.StatusBadRequest, "BadExpirationDate", "apns-expiration "+strings.Join(e, ",")+" is not a number")
		}
	}
	limit := apnsMaxPayload
	if pushType == "voip" {
		limit = apnsMaxPayloadVoIP
	}
	switch {
	case len(req.Body) == 0:
		return refuse(http.StatusBadRequest, "PayloadEmpty", "empty payload")
	case len(req.Body) > limit:
		return refuse(http.StatusRequestEntityTooLarge, "PayloadTooLarge", "payload of "+strconv.Itoa(len(req.Body))+" bytes, limit "+strconv.Itoa(limit))
	}
	return http.StatusOK, ""
}

// checkProviderToken verifies the authorization header. Like Apple, it
// verifies each distinct token's signature once and remembers the result.
func (f *FakeAPNs) checkProviderToken(r *http.Request, req *APNsRequest) (status int, reason, problem string) {
	auth := r.Header.Get("authorization")
	if auth == "" {
		return http.StatusForbidden, "MissingProviderToken", "no authorization header"
	}
	scheme, bearer, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || bearer == "" {
		return http.StatusForbidden, "InvalidProviderToken", "authorization is not \"bearer <JWT>\""
	}
	req.Bearer = bearer

	f.mu.Lock()
	claims, known := f.verified[bearer]
	expired := f.expired[bearer]
	f.mu.Unlock()
	if !known {
		jwt, err := parseJWT(bearer)
		if err != nil {
			return http.StatusForbidden, "InvalidProviderToken", "provider token: " + err.Error()
		}
		req.KeyID = jwt.header.Kid
		if err := json.Unmarshal(jwt.claims, &claims); err != nil {
			return http.StatusForbidden, "InvalidProviderToken", "provider token claims: " + err.Error()
		}
		req.IssuedAt = time.Unix(claims.Iat, 0)
		switch {
		case jwt.header.Kid != f.keyID:
			return http.StatusForbidden, "InvalidProviderToken", "provider token kid " + strconv.Quote(jwt.header.Kid) + ", want " + strconv.Quote(f.keyID)
		case claims.Iss != f.teamID:
			return http.StatusForbidden, "InvalidProviderToken", "provider token iss " + strconv.Quote(claims.Iss) + ", want " + strconv.Quote(f.teamID)
		case claims.Iat == 0:
			return http.StatusForbidden, "InvalidProviderToken", "provider token without iat"
		}
		if err := jwt.verifyES256(f.pub); err != nil {
			return http.StatusForbidden, "InvalidProviderToken", "provider token: " + err.Error()
		}
		f.mu.Lock()
		f.verified[bearer] = claims
		f.mu.Unlock()
	}
	req.KeyID = f.keyID
	req.IssuedAt = time.Unix(claims.Iat, 0)
	age := time.Since(req.IssuedAt)
	switch {
	case age < -apnsClockSkew:
		return http.StatusForbidden, "InvalidProviderToken", "provider token issued in the future"
	case expired:
		return http.StatusForbidden, "ExpiredProviderToken", "provider token declared expired by ExpireProviderTokens"
	case age > apnsTokenLifetime:
		return http.StatusForbidden, "ExpiredProviderToken", "provider token older than an hour"
	}
	return http.StatusOK, "", ""
}
