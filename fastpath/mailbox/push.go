package mailbox

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
	"edgerelay/push/apns"
	"edgerelay/push/fcm"
	"edgerelay/store"
)

// Pushers are the loaded push modules; a nil one is not loaded: its
// registrations are kept and validated, and nothing is sent.
type Pushers struct {
	APNs *apns.Client
	FCM  *fcm.Client
}

// Limits of push registrations.
const (
	maxRegistrationBody = 8 << 10
	maxAlertChars       = 160
	maxGenericFields    = 8
	maxGenericValue     = 256
	defaultAlert        = "New message"
	// pushQueue bounds the pushes waiting to be sent; past it a push is
	// skipped (pushes are best-effort and never delay a write).
	pushQueue   = 4096
	pushTimeout = 15 * time.Second
	// pushInFlight bounds the pushes sent at once.
	pushInFlight = 256
)

// registration is a validated push registration, what is sealed at rest.
type registration struct {
	Service     string            `json:"service"`
	Token       string            `json:"token,omitempty"`
	Environment string            `json:"environment,omitempty"`
	Tag         string            `json:"tag"`
	Alert       string            `json:"alert,omitempty"`
	Other       map[string]string `json:"other,omitempty"`
}

// parseRegistration applies the field rules of the spec: the generic
// members for every service, and each module's own rules (unknown fields
// refused) for apns and fcm.
func parseRegistration(body []byte) (registration, bool) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		return registration{}, false
	}
	str := func(k string) (string, bool, bool) { // value, present, ok
		v, present := raw[k]
		if !present {
			return "", false, true
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return "", true, false
		}
		return s, true, true
	}
	var r registration
	var ok, present bool
	if r.Service, present, ok = str("service"); !ok || !present || !validService(r.Service) {
		return r, false
	}
	if r.Tag, present, ok = str("tag"); !ok || !present || !validTag(r.Tag) {
		return r, false
	}
	if r.Alert, present, ok = str("alert"); !ok || (present && utf8.RuneCountInString(r.Alert) > maxAlertChars) {
		return r, false
	}
	delete(raw, "service")
	delete(raw, "tag")
	delete(raw, "alert")
	switch r.Service {
	case "apns":
		if r.Token, present, ok = str("token"); !ok || !present || !validAPNsToken(r.Token) {
			return r, false
		}
		if r.Environment, present, ok = str("environment"); !ok || (present && r.Environment != "production" && r.Environment != "development") {
			return r, false
		}
		if !present {
			r.Environment = "production"
		}
		delete(raw, "token")
		delete(raw, "environment")
		return r, len(raw) == 0
	case "fcm":
		if r.Token, present, ok = str("token"); !ok || !present || !validFCMToken(r.Token) {
			return r, false
		}
		delete(raw, "token")
		return r, len(raw) == 0
	}
	// A service with no module: kept, under the generic limits.
	if len(raw) > maxGenericFields {
		return r, false
	}
	r.Other = make(map[string]string, len(raw))
	for k := range raw {
		v, _, ok := str(k)
		if !ok || utf8.RuneCountInString(v) > maxGenericValue || utf8.RuneCountInString(k) > maxGenericValue {
			return r, false
		}
		r.Other[k] = v
	}
	return r, true
}

func validService(s string) bool {
	if len(s) < 1 || len(s) > 16 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

func validTag(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// validAPNsToken: lowercase hex of 32 to 100 bytes.
func validAPNsToken(s string) bool {
	if len(s) < 64 || len(s) > 200 || len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// validFCMToken: 32 to 1024 of A-Z a-z 0-9 _ : -.
func validFCMToken(s string) bool {
	if len(s) < 32 || len(s) > 1024 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != ':' && c != '-' {
			return false
		}
	}
	return true
}

// sealKey derives the registration key: HKDF-SHA256(ikm = the bearer's
// bytes, salt = "zerobyte-push-v1", info = "<mailbox id>/<p2c|c2p>").
// Only a request presenting the bearer can open the registration.
func sealKey(bearer []byte, id []byte, dir byte) (cipher.AEAD, error) {
	info := string(id) + "/" + dirName(dir)
	key, err := hkdf.Key(sha256.New, bearer, []byte("zerobyte-push-v1"), info, 32)
	if err != nil {
		return nil, fmt.Errorf("mailbox: push key: %w", err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("mailbox: push key: %w", err)
	}
	return cipher.NewGCM(block)
}

func dirName(dir byte) string {
	if dir == store.DirP2C {
		return "p2c"
	}
	return "c2p"
}

// seal returns nonce || AES-256-GCM(registration).
func seal(aead cipher.AEAD, r registration) ([]byte, error) {
	plain, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("mailbox: encode registration: %w", err)
	}
	out := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return nil, fmt.Errorf("mailbox: registration nonce: %w", err)
	}
	return aead.Seal(out, out, plain, nil), nil
}

func open(aead cipher.AEAD, sealed []byte) (registration, error) {
	var r registration
	if len(sealed) < aead.NonceSize() {
		return r, errors.New("mailbox: sealed registration too short")
	}
	plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], nil)
	if err != nil {
		return r, fmt.Errorf("mailbox: open registration: %w", err)
	}
	if err := json.Unmarshal(plain, &r); err != nil {
		return r, fmt.Errorf("mailbox: decode registration: %w", err)
	}
	return r, nil
}

// register is PUT and DELETE of …/<dir>/push.
func (h *Handler) register(ctx *fasthttp.RequestCtx, m store.Mailbox, r route, tok []byte, key uint64, now int64) {
	method := string(ctx.Method())
	if method != fasthttp.MethodPut && method != fasthttp.MethodDelete {
		errNotFound.answer(ctx)
		return
	}
	if method == fasthttp.MethodPut && len(ctx.Request.Body()) > maxRegistrationBody {
		errTooLarge.answer(ctx)
		return
	}
	if !h.take(ctx, h.limits.registrations, key, now) {
		return
	}
	if method == fasthttp.MethodDelete {
		if err := m.DeletePushRegistration(context.Background(), r.dir); err != nil {
			h.internal(ctx, err)
			return
		}
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		return
	}
	reg, ok := parseRegistration(ctx.Request.Body())
	if !ok {
		errBadRequest.answer(ctx)
		return
	}
	aead, err := sealKey(tok, r.id, r.dir)
	if err != nil {
		h.internal(ctx, err)
		return
	}
	sealed, err := seal(aead, reg)
	if err != nil {
		h.internal(ctx, err)
		return
	}
	switch err := m.SetPushRegistration(context.Background(), r.dir, sealed); {
	case errors.Is(err, store.ErrNotFound): // erased since Open
		errNotFound.answer(ctx)
		return
	case err != nil:
		h.internal(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// pushJob is one wake-up to send after a write was acknowledged. It
// names the mailbox and the writer's token rather than holding the
// mailbox: the sender opens it again, so a mailbox erased meanwhile wakes
// nobody.
type pushJob struct {
	name   string
	token  store.Hash
	id     []byte
	dir    byte
	bearer []byte
	notify string // "alert" or "silent"
	topic  string
}

// schedulePush queues a wake-up for the reader of r.dir after a write the
// store stored with a push token (none when the reader was in the
// foreground or the push bucket was empty: skipped silently). It never
// blocks the write's answer.
func (h *Handler) schedulePush(m store.Mailbox, r route, tok []byte, tokHash store.Hash, notify []byte, res store.PutResult) {
	switch {
	case res.Foreground:
		h.m.pushes.WithLabelValues("foreground").Inc()
		return
	case !res.Push:
		h.m.pushes.WithLabelValues("rate_limited").Inc()
		return
	}
	job := pushJob{name: m.Name(), token: tokHash, id: bytes.Clone(r.id), dir: r.dir, bearer: bytes.Clone(tok), notify: string(notify), topic: r.app.PushTopic}
	select {
	case h.pushJobs <- job:
	default:
		h.m.pushes.WithLabelValues("queue_full").Inc()
	}
}

// SendPushes sends queued wake-ups until ctx ends (Run starts it; tests
// that need pushes without the sweeper start it alone). Up to
// pushInFlight pushes run at once: a provider answers in tens of
// milliseconds and APNs multiplexes hundreds of streams on one HTTP/2
// connection, so the rate is bounded by concurrency over the round trip.
func (h *Handler) SendPushes(ctx context.Context) {
	slots := make(chan struct{}, pushInFlight)
	for {
		select {
		case <-ctx.Done():
			return
		case job := <-h.pushJobs:
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			go func() {
				defer func() { <-slots }()
				h.sendPush(ctx, job)
			}()
		}
	}
}

func (h *Handler) sendPush(ctx context.Context, job pushJob) {
	m, err := h.cfg.Store.Open(ctx, []byte(job.name), job.token, h.cfg.Now().UnixNano())
	if err != nil { // erased, expired or re-claimed since the write: nobody to wake
		h.m.pushes.WithLabelValues("unregistered").Inc()
		return
	}
	defer m.Release()
	// The write's node saw no foreground reader; one on another node
	// counts too (asked here, off the write's path).
	if m.Foreground(ctx, job.dir, h.cfg.Now().UnixNano()) {
		h.m.pushes.WithLabelValues("foreground").Inc()
		return
	}
	sealed, err := m.PushRegistration(ctx, job.dir)
	if errors.Is(err, store.ErrNotFound) {
		h.m.pushes.WithLabelValues("unregistered").Inc()
		return
	}
	if err != nil {
		h.log.Error("push registration read failed", "err", err)
		return
	}
	aead, err := sealKey(job.bearer, job.id, job.dir)
	if err != nil {
		return
	}
	reg, err := open(aead, sealed)
	if err != nil {
		// Sealed under another bearer (the mailbox was re-claimed): the
		// writer cannot open it, so there is nobody to wake.
		h.m.pushes.WithLabelValues("unopenable").Inc()
		return
	}
	sctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	var unregistered bool
	switch {
	case reg.Service == "apns" && h.cfg.Push.APNs != nil:
		n := apnsNotification(reg, job.notify, job.topic)
		res, err := h.cfg.Push.APNs.Send(sctx, n)
		if err != nil {
			h.m.pushes.WithLabelValues("failed").Inc()
			h.log.Warn("apns push failed", "err", err)
			return
		}
		unregistered = res.Unregistered
		h.countResult(res.Status)
	case reg.Service == "fcm" && h.cfg.Push.FCM != nil:
		res, err := h.cfg.Push.FCM.Send(sctx, fcmMessage(reg, job.notify))
		if err != nil {
			h.m.pushes.WithLabelValues("failed").Inc()
			h.log.Warn("fcm push failed", "err", err)
			return
		}
		unregistered = res.Unregistered
		h.countResult(res.Status)
	default:
		h.m.pushes.WithLabelValues("no_module").Inc()
		return
	}
	if unregistered {
		h.dropRegistration(ctx, m, job.dir, sealed)
	}
}

func (h *Handler) countResult(status int) {
	if status == 200 {
		h.m.pushes.WithLabelValues("sent").Inc()
	} else {
		h.m.pushes.WithLabelValues("refused").Inc()
	}
}

// dropRegistration deletes a registration the provider called stale,
// unless the device registered again meanwhile.
func (h *Handler) dropRegistration(ctx context.Context, m store.Mailbox, dir byte, sent []byte) {
	dropped, err := m.DropPushRegistration(ctx, dir, sent)
	if err != nil {
		h.log.Error("stale registration delete failed", "err", err)
		return
	}
	if dropped {
		h.m.pushes.WithLabelValues("stale_removed").Inc()
	}
}

// apnsNotification builds the exact APNs request of the spec.
func apnsNotification(reg registration, notify, topic string) apns.Notification {
	n := apns.Notification{DeviceToken: reg.Token, Topic: topic, Environment: reg.Environment}
	tag := jsonString(reg.Tag)
	if notify == "alert" {
		n.PushType, n.Priority = "alert", 10
		n.Payload = []byte(`{"aps":{"alert":{"body":` + jsonString(alertText(reg)) + `},"mutable-content":1,"sound":"default"},"zerobyte":{"tag":` + tag + `}}`)
	} else {
		n.PushType, n.Priority = "background", 5
		n.Payload = []byte(`{"aps":{"content-available":1},"zerobyte":{"tag":` + tag + `}}`)
	}
	return n
}

// fcmMessage builds the exact FCM HTTP v1 message of the spec.
func fcmMessage(reg registration, notify string) []byte {
	head := `{"message":{"token":` + jsonString(reg.Token) + `,"data":{"zerobyte_tag":` + jsonString(reg.Tag)
	if notify == "alert" {
		return []byte(head + `,"zerobyte_notify":"alert","zerobyte_alert":` + jsonString(alertText(reg)) + `},"android":{"priority":"high","ttl":"604800s"}}}`)
	}
	return []byte(head + `,"zerobyte_notify":"silent"},"android":{"priority":"normal","ttl":"3600s"}}}`)
}

func alertText(reg registration) string {
	if reg.Alert == "" {
		return defaultAlert
	}
	return reg.Alert
}

// jsonString encodes s as a JSON string escaping only what JSON requires
// (no HTML escaping), as JSON.stringify would.
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return string(bytes.TrimRight(b.Bytes(), "\n"))
}

// HasRegistration reports whether a direction ("p2c" or "c2p") of the
// mailbox named "<app>/<id>", held by the bearer tok, holds a push
// registration, for tests and the operator.
func (h *Handler) HasRegistration(name, dir string, tok []byte) bool {
	d := store.DirP2C
	if dir == "c2p" {
		d = store.DirC2P
	}
	m, err := h.cfg.Store.Open(context.Background(), []byte(name), httpx.Hash(tok), h.cfg.Now().UnixNano())
	if err != nil {
		return false
	}
	defer m.Release()
	_, err = m.PushRegistration(context.Background(), d)
	return err == nil
}
