package pushtest

import (
	"bytes"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The OAuth2 JWT-bearer grant (RFC 7523) and FCM's scope.
const (
	jwtBearerGrant = "urn:ietf:params:oauth:grant-type:jwt-bearer"
	fcmScope       = "https://www.googleapis.com/auth/firebase.messaging"
)

// FCMMaxData is the fake's limit on a message's data, in bytes of its keys
// and values.
const FCMMaxData = 4096

// FakeGoogle is Google's OAuth2 token endpoint and FCM HTTP v1 on one local
// TLS server (HTTP/2 or HTTP/1.1, as the client prefers).
//
// The token endpoint, POST /token (TokenURL), takes the form
// grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>
// and checks the assertion: header alg RS256, signature verified with the
// trusted key of its iss, aud = TokenURL, scope naming firebase.messaging,
// iat not in the future, exp after now and at most an hour after iat. It
// answers {"access_token":…,"expires_in":…,"token_type":"Bearer"} and
// remembers the token, or 400 invalid_grant like Google.
//
// FCM, POST /v1/projects/<project>/messages:send, checks that the bearer is
// a live token it issued (else 401 UNAUTHENTICATED) and that the body is a
// message FCM would parse (JSON; message.token present; data values
// strings, keys and values at most FCMMaxData bytes; android.priority normal or high; android.ttl a duration; no
// unknown field), else 400 INVALID_ARGUMENT. A valid message gets the
// answer programmed for its registration token, or 200 {"name":…}. Every
// token request and every send is recorded.
type FakeGoogle struct {
	tlsServer

	mu       sync.Mutex
	accounts map[string]*rsa.PublicKey // trusted service accounts by email
	lifetime time.Duration             // expires_in of new access tokens
	tokens   map[string]time.Time      // live access tokens and their expiry
	answers  answers[FCMAnswer]
	messages int
	grants   recorder[TokenGrant]
	sends    recorder[FCMRequest]
}

// TokenGrant is one request to the token endpoint and its outcome.
type TokenGrant struct {
	Form        map[string][]string // the form as received
	KeyID       string              // the assertion's kid
	Issuer      string              // iss
	Audience    string              // aud
	Scope       string              // scope
	IssuedAt    time.Time           // iat
	Status      int                 // the status the fake answered
	AccessToken string              // the token issued, "" when refused
	// Problem says why the fake refused the grant, "" when it issued a
	// token.
	Problem string
}

// FCMRequest is one request to FCM and what the fake answered.
type FCMRequest struct {
	Project           string      // from the path
	Header            http.Header // as received
	Body              []byte      // as received
	Proto             string
	RemoteAddr        string
	AccessToken       string // the bearer presented
	RegistrationToken string // message.token, when the body parsed
	Status            int    // the status the fake answered
	ErrorCode         string // the errorCode (or status) of a refusal
	// Problem says why the fake itself refused the request (a failed
	// check); "" when it passed, whatever answer was programmed.
	Problem string
}

// FCMAnswer is an answer FCM gives to a send. The zero value and Code 200
// mean success.
type FCMAnswer struct {
	Code       int           // HTTP status
	Status     string        // error.status, the google.rpc code name
	ErrorCode  string        // the FcmError errorCode detail; "" for none
	Message    string        // error.message
	RetryAfter time.Duration // a Retry-After header, when non-zero
}

// Answers FCM documents for its common failures.

// FCMUnregistered is 404 UNREGISTERED: the app was uninstalled or the token
// expired. The only answer that means "delete this device".
func FCMUnregistered() FCMAnswer {
	return FCMAnswer{Code: 404, Status: "NOT_FOUND", ErrorCode: "UNREGISTERED", Message: "Requested entity was not found."}
}

// FCMInvalidArgument is 400 INVALID_ARGUMENT (a malformed registration
// token, for one).
func FCMInvalidArgument() FCMAnswer {
	return FCMAnswer{Code: 400, Status: "INVALID_ARGUMENT", ErrorCode: "INVALID_ARGUMENT", Message: "The registration token is not a valid FCM registration token"}
}

// FCMSenderIDMismatch is 403 SENDER_ID_MISMATCH: the token belongs to
// another Firebase project.
func FCMSenderIDMismatch() FCMAnswer {
	return FCMAnswer{Code: 403, Status: "PERMISSION_DENIED", ErrorCode: "SENDER_ID_MISMATCH", Message: "SenderId mismatch"}
}

// FCMUnauthenticated is 401 UNAUTHENTICATED, FCM's answer to a bad access
// token. RevokeTokens provokes it for real.
func FCMUnauthenticated() FCMAnswer {
	return FCMAnswer{Code: 401, Status: "UNAUTHENTICATED", Message: "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."}
}

// FCMQuotaExceeded is 429 QUOTA_EXCEEDED with a Retry-After.
func FCMQuotaExceeded(retryAfter time.Duration) FCMAnswer {
	return FCMAnswer{Code: 429, Status: "RESOURCE_EXHAUSTED", ErrorCode: "QUOTA_EXCEEDED", Message: "Quota exceeded for quota metric 'Send requests'.", RetryAfter: retryAfter}
}

// FCMUnavailable is 503 UNAVAILABLE: FCM overloaded, retry later.
func FCMUnavailable() FCMAnswer {
	return FCMAnswer{Code: 503, Status: "UNAVAILABLE", ErrorCode: "UNAVAILABLE", Message: "The service is currently unavailable."}
}

// FCMInternal is 500 INTERNAL.
func FCMInternal() FCMAnswer {
	return FCMAnswer{Code: 500, Status: "INTERNAL", ErrorCode: "INTERNAL", Message: "Internal error encountered."}
}

// NewGoogle starts a fake Google that trusts the service account email
// whose public key is pub. With email "" it trusts none until Trust is
// called, which breaks the chicken-and-egg of a service account whose
// token_uri must name the running fake: see NewGoogleWithAccount. It stops
// when the test ends.
func NewGoogle(t testing.TB, serviceAccountEmail string, pub *rsa.PublicKey) *FakeGoogle {
	t.Helper()
	g := &FakeGoogle{
		accounts: make(map[string]*rsa.PublicKey),
		lifetime: time.Hour,
		tokens:   make(map[string]time.Time),
	}
	if serviceAccountEmail != "" {
		g.accounts[serviceAccountEmail] = pub
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/token", g.serveToken)
	mux.HandleFunc("/v1/", g.serveFCM)
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	g.srv = srv
	t.Cleanup(srv.Close)
	return g
}

// NewGoogleWithAccount starts a fake Google and makes a service account it
// trusts, whose token_uri points at it. It returns the fake, the account's
// JSON (write it with WriteFile for fcm.Config.CredentialsFile) and its key.
func NewGoogleWithAccount(t testing.TB) (g *FakeGoogle, credentials []byte, priv *rsa.PrivateKey) {
	t.Helper()
	g = NewGoogle(t, "", nil)
	credentials, priv, email := NewServiceAccount(t, g.TokenURL())
	g.Trust(email, &priv.PublicKey)
	return g, credentials, priv
}

// TokenURL is the token endpoint's URL, for a service account's token_uri.
func (g *FakeGoogle) TokenURL() string { return g.srv.URL + "/token" }

// Trust makes the token endpoint accept assertions of the service account
// email signed by the key whose public half is pub (replacing any earlier
// key of that account).
func (g *FakeGoogle) Trust(email string, pub *rsa.PublicKey) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.accounts[email] = pub
}

// SetTokenLifetime sets the expires_in of access tokens issued from now on
// (an hour by default). The fake also refuses them after that long.
func (g *FakeGoogle) SetTokenLifetime(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lifetime = d
}

// RevokeTokens invalidates every access token issued so far: FCM answers
// 401 to them from now on, as it does to a revoked or rotated credential.
func (g *FakeGoogle) RevokeTokens() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.tokens)
}

// Answer makes every later valid send to registrationToken get answer; an
// FCMAnswer{} restores success. One-shot answers go first.
func (g *FakeGoogle) Answer(registrationToken string, answer FCMAnswer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.answers.setSticky(registrationToken, answer)
}

// AnswerOnce makes the next valid send to registrationToken get answer;
// several calls queue answers in order.
func (g *FakeGoogle) AnswerOnce(registrationToken string, answer FCMAnswer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.answers.setOnce(registrationToken, answer)
}

// Grants returns every token request so far, in order.
func (g *FakeGoogle) Grants() []TokenGrant { return g.grants.all() }

// Sends returns every FCM request so far, in order.
func (g *FakeGoogle) Sends() []FCMRequest { return g.sends.all() }

// WaitSends returns the FCM requests once at least n have arrived, or those
// that arrived when timeout passes. For pushes sent asynchronously.
func (g *FakeGoogle) WaitSends(n int, timeout time.Duration) []FCMRequest {
	return g.sends.wait(n, timeout)
}

// serveToken is the OAuth2 token endpoint.
func (g *FakeGoogle) serveToken(w http.ResponseWriter, r *http.Request) {
	grant := TokenGrant{}
	refuse := func(status int, code, description, problem string) {
		grant.Status, grant.Problem = status, problem
		g.grants.add(grant)
		writeJSON(w, status, map[string]string{"error": code, "error_description": description})
	}
	if r.Method != http.MethodPost {
		refuse(http.StatusMethodNotAllowed, "invalid_request", "Method not allowed", "method "+r.Method+", want POST")
		return
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/x-www-form-urlencoded") {
		refuse(http.StatusBadRequest, "invalid_request", "Bad Request", "content type "+strconv.Quote(ct)+", want a form")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		refuse(http.StatusBadRequest, "invalid_request", "Bad Request", "form: "+err.Error())
		return
	}
	grant.Form = r.PostForm
	if gt := r.PostForm.Get("grant_type"); gt != jwtBearerGrant {
		refuse(http.StatusBadRequest, "unsupported_grant_type", "Invalid grant_type: "+gt, "grant_type "+strconv.Quote(gt))
		return
	}
	assertion, err := parseJWT(r.PostForm.Get("assertion"))
	if err != nil {
		refuse(http.StatusBadRequest, "invalid_grant", "Invalid JWT: "+err.Error(), "assertion: "+err.Error())
		return
	}
	var claims struct {
		Iss   string `json:"iss"`
		Aud   string `json:"aud"`
		Scope string `json:"scope"`
		Iat   int64  `json:"iat"`
		Exp   int64  `json:"exp"`
	}
	if err := json.Unmarshal(assertion.claims, &claims); err != nil {
		refuse(http.StatusBadRequest, "invalid_grant", "Invalid JWT: claims", "assertion claims: "+err.Error())
		return
	}
	grant.KeyID, grant.Issuer, grant.Audience, grant.Scope = assertion.header.Kid, claims.Iss, claims.Aud, claims.Scope
	grant.IssuedAt = time.Unix(claims.Iat, 0)

	g.mu.Lock()
	pub := g.accounts[claims.Iss]
	lifetime := g.lifetime
	g.mu.Unlock()
	now := time.Now()
	switch {
	case pub == nil:
		refuse(http.StatusBadRequest, "invalid_grant", "Invalid grant: account not found", "iss "+strconv.Quote(claims.Iss)+" is not a trusted service account")
		return
	case claims.Aud != g.TokenURL():
		refuse(http.StatusBadRequest, "invalid_grant", "Invalid JWT: Failed audience check.", "aud "+strconv.Quote(claims.Aud)+", want "+strconv.Quote(g.TokenURL()))
		return
	case !containsWord(claims.Scope, fcmScope):
		refuse(http.StatusBadRequest, "invalid_scope", "Invalid OAuth scope or ID token audience provided.", "scope "+strconv.Quote(claims.Scope)+" lacks "+fcmScope)
		return
	case claims.Iat == 0 || claims.Exp == 0:
		refuse(http.StatusBadRequest, "invalid_grant", "Invalid JWT: iat and exp are required.", "assertion without iat or exp")
		return
	case time.Unix(claims.Iat, 0).After(now.Add(time.Minute)),
		!time.Unix(claims.Exp, 0).After(now),
		claims.Exp-claims.Iat > 3600:
		refuse(http.StatusBadRequest, "invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.", "iat/exp out of range")
		return
	}
	if err := assertion.verifyRS256(pub); err != nil {
		refuse(http.StatusBadRequest, "invalid_grant", "Invalid JWT Signature.", "assertion: "+err.Error())
		return
	}

	access := "ya29.pushtest-" + randomHex(24)
	g.mu.Lock()
	g.tokens[access] = now.Add(lifetime)
	g.mu.Unlock()
	grant.Status, grant.AccessToken = http.StatusOK, access
	g.grants.add(grant)
	writeJSON(w, http.StatusOK, map[string]any{
		"access_token": access,
		"expires_in":   int(lifetime / time.Second),
		"token_type":   "Bearer",
	})
}

// fcmPath matches FCM's send method.
var fcmPath = regexp.MustCompile(`^/v1/projects/([^/]+)/messages:send$`)

// serveFCM is FCM HTTP v1's send method.
func (g *FakeGoogle) serveFCM(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	req := FCMRequest{Header: r.Header.Clone(), Body: body, Proto: r.Proto, RemoteAddr: r.RemoteAddr}
	answer := g.checkSend(r, &req)
	if req.Problem == "" {
		g.mu.Lock()
		if a, ok := g.answers.next(req.RegistrationToken); ok {
			answer = a
		}
		g.mu.Unlock()
	}
	if answer.Code == 0 {
		answer.Code = http.StatusOK
	}
	req.Status = answer.Code
	if answer.Code != http.StatusOK {
		req.ErrorCode = answer.ErrorCode
		if req.ErrorCode == "" {
			req.ErrorCode = answer.Status
		}
	}
	g.sends.add(req)

	if answer.Code == http.StatusOK {
		g.mu.Lock()
		g.messages++
		n := g.messages
		g.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]string{"name": fmt.Sprintf("projects/%s/messages/0:%d%%pushtest", req.Project, n)})
		return
	}
	if answer.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((answer.RetryAfter+time.Second-1)/time.Second)))
	}
	writeJSON(w, answer.Code, fcmErrorBody(answer))
}

// fcmErrorBody is the google.rpc.Status JSON FCM answers with.
func fcmErrorBody(a FCMAnswer) map[string]any {
	e := map[string]any{"code": a.Code, "message": a.Message, "status": a.Status}
	if a.ErrorCode != "" {
		e["details"] = []map[string]string{{
			"@type":     "type.googleapis.com/google.firebase.fcm.v1.FcmError",
			"errorCode": a.ErrorCode,
		}}
	}
	return map[string]any{"error": e}
}

// checkSend runs FCM's checks, returning the zero answer when the request
// passes and FCM's refusal (with req.Problem set) when it does not.
func (g *FakeGoogle) checkSend(r *http.Request, req *FCMRequest) FCMAnswer {
	refuse := func(a FCMAnswer, problem string) FCMAnswer {
		req.Problem = problem
		return a
	}
	m := fcmPath.FindStringSubmatch(r.URL.Path)
	if m == nil {
		return refuse(FCMAnswer{Code: 404, Status: "NOT_FOUND", Message: "Not Found"}, "path "+r.URL.Path+", want /v1/projects/<project>/messages:send")
	}
	req.Project = m[1]
	if r.Method != http.MethodPost {
		return refuse(FCMAnswer{Code: 405, Status: "INVALID_ARGUMENT", Message: "Method not allowed"}, "method "+r.Method+", want POST")
	}

	scheme, access, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if strings.EqualFold(scheme, "bearer") {
		req.AccessToken = access
	}
	g.mu.Lock()
	expiry, live := g.tokens[req.AccessToken]
	g.mu.Unlock()
	switch {
	case req.AccessToken == "":
		return refuse(FCMUnauthenticated(), "no bearer access token")
	case !live:
		return refuse(FCMUnauthenticated(), "access token not issued by the fake, or revoked")
	case time.Now().After(expiry):
		return refuse(FCMUnauthenticated(), "access token expired")
	}

	token, problem := checkFCMMessage(req.Body)
	req.RegistrationToken = token
	if problem != "" {
		return refuse(FCMAnswer{Code: 400, Status: "INVALID_ARGUMENT", Message: "Invalid JSON payload received. " + problem}, problem)
	}
	return FCMAnswer{}
}

// checkFCMMessage checks what FCM's JSON parser would refuse, returning the
// registration token and a problem ("" when none). It covers the fields the
// relay sends; an unknown field is refused as FCM refuses it.
func checkFCMMessage(body []byte) (token, problem string) {
	var req map[string]json.RawMessage
	if err := decodeObject(body, &req); err != nil {
		return "", "body: " + err.Error()
	}
	for k := range req {
		if k != "message" && k != "validate_only" && k != "validateOnly" {
			return "", "Unknown name " + strconv.Quote(k) + ": Cannot find field."
		}
	}
	var msg map[string]json.RawMessage
	if err := decodeObject(req["message"], &msg); err != nil {
		return "", "message: " + err.Error()
	}
	for k := range msg {
		switch k {
		case "name", "data", "notification", "android", "webpush", "apns", "fcm_options", "fcmOptions", "token", "topic", "condition":
		default:
			return "", "Unknown name " + strconv.Quote(k) + " at 'message': Cannot find field."
		}
	}
	if err := json.Unmarshal(msg["token"], &token); err != nil || token == "" {
		return "", "message.token: a non-empty string is required (the fake supports only token targets)"
	}
	if raw, ok := msg["data"]; ok {
		var data map[string]json.RawMessage
		if err := decodeObject(raw, &data); err != nil {
			return token, "message.data: " + err.Error()
		}
		size := 0
		for k, v := range data {
			var s string
			if json.Unmarshal(v, &s) != nil {
				return token, "Invalid value at 'message.data[" + k + "].value' (TYPE_STRING)"
			}
			size += len(k) + len(s)
		}
		// FCM's 4 KB limit on a data message, counted over the keys and
		// values (the relay's JSON measure is stricter).
		if size > FCMMaxData {
			return token, "Android message is too big: data of " + strconv.Itoa(size) + " bytes, limit " + strconv.Itoa(FCMMaxData)
		}
	}
	if raw, ok := msg["android"]; ok {
		var android map[string]json.RawMessage
		if err := decodeObject(raw, &android); err != nil {
			return token, "message.android: " + err.Error()
		}
		for k, v := range android {
			switch k {
			case "priority":
				var p string
				if json.Unmarshal(v, &p) != nil || (!strings.EqualFold(p, "normal") && !strings.EqualFold(p, "high")) {
					return token, "Invalid value at 'message.android.priority': " + string(v)
				}
			case "ttl":
				var ttl string
				if json.Unmarshal(v, &ttl) != nil || !durationRE.MatchString(ttl) {
					return token, "Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration): " + string(v)
				}
			case "collapse_key", "collapseKey", "restricted_package_name", "restrictedPackageName",
				"data", "notification", "fcm_options", "fcmOptions", "direct_boot_ok", "directBootOk":
			default:
				return token, "Unknown name " + strconv.Quote(k) + " at 'message.android': Cannot find field."
			}
		}
	}
	return token, ""
}

// durationRE is protobuf's JSON form of a Duration: seconds with up to nine
// fractional digits and an s.
var durationRE = regexp.MustCompile(`^-?[0-9]+(\.[0-9]{1,9})?s$`)

// decodeObject decodes a JSON object, refusing null and non-objects.
func decodeObject(raw []byte, v *map[string]json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return fmt.Errorf("not a JSON object")
	}
	return json.Unmarshal(raw, v)
}

func containsWord(list, word string) bool {
	for _, w := range strings.Fields(list) {
		if w == word {
			return true
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
