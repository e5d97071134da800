package pushgw

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"edgerelay/push"
	"edgerelay/push/apns"
	"edgerelay/push/fcm"
)

// outcome classifies one delivery attempt.
type outcome uint8

const (
	delivered outcome = iota // the provider accepted it (2xx)
	stale                    // the device token is dead: the caller removes the device
	refused                  // the provider answered something else
	errored                  // no answer from the provider
)

// delivery is what the gateway learned from the provider.
type delivery struct {
	outcome outcome
	// notSent: the provider was provably never contacted (refund).
	notSent bool
	// status and detail describe a refusal or an error for the log only
	// (clipped there); they never reach the caller.
	status int
	detail string
	// clipped: the payload was clipped to the provider's limit first.
	clipped *clipping
}

// sender delivers one validated message through a provider.
type sender interface {
	send(ctx context.Context, msg *sendMessage, buf []byte) delivery
	name() string
}

// maxLogDetail bounds the provider's text in a log line.
const maxLogDetail = 200

// apnsSender delivers through APNs.
type apnsSender struct {
	c     *apns.Client
	topic string
}

func (s *apnsSender) name() string { return ProviderAPNs }

// apnsCategory tells the app's notification extension what it is
// looking at: MFA_CHALLENGE when data.type is "mfa_challenge".
func apnsCategory(msg *sendMessage) string {
	for _, e := range msg.data {
		if string(e.key) == "type" && string(e.val) == "mfa_challenge" {
			return "MFA_CHALLENGE"
		}
	}
	return "MAIL_NOTIFICATION"
}

// appendAPNsPayload writes the notification: every data entry as a
// top-level string, then "aps" last so that data cannot replace it (a data
// entry named "aps" is dropped), with category (apnsCategory, decided
// before any clipping).
func appendAPNsPayload(b []byte, msg *sendMessage, category string) []byte {
	b = append(b, '{')
	for _, e := range msg.data {
		if apnsSkips(e.key) {
			continue
		}
		b = appendJSONString(b, e.key)
		b = append(b, ':')
		b = appendJSONString(b, e.val)
		b = append(b, ',')
	}
	b = append(b, `"aps":{"alert":{"title":`...)
	b = appendJSONString(b, msg.title)
	b = append(b, `,"body":`...)
	b = appendJSONString(b, msg.body)
	b = append(b, `},"sound":"default","mutable-content":1,"category":"`...)
	b = append(b, category...)
	return append(b, `"}}`...)
}

func (s *apnsSender) send(ctx context.Context, msg *sendMessage, buf []byte) delivery {
	// The payload is handed to net/http, which may still read it after
	// Send returns (an HTTP/2 answer can arrive before the body is
	// written); it gets its own copy, never the pooled buffer.
	category := apnsCategory(msg)
	clipped := fit(msg, apnsMaxPayload, func(m *sendMessage) int { return apnsPayloadLen(m, category) }, apnsSkips, true)
	payload := bytes.Clone(appendAPNsPayload(buf[:0], msg, category))
	res, err := s.c.Send(ctx, apns.Notification{
		DeviceToken: string(msg.token),
		Topic:       s.topic,
		PushType:    apns.PushTypeAlert,
		Priority:    apns.PriorityHigh,
		Payload:     payload,
	})
	d := apnsDelivery(res, err)
	d.clipped = clipped
	return d
}

func apnsDelivery(res apns.Result, err error) delivery {
	if err != nil {
		return sendError(err)
	}
	switch {
	case res.Status >= 200 && res.Status < 300:
		return delivery{outcome: delivered, status: res.Status}
	case res.Status == http.StatusGone:
		// Only 410 deletes a device: a 400 BadDeviceToken usually means the
		// gateway's own environment is wrong, and deleting every device
		// would be the wrong cure.
		return delivery{outcome: stale, status: res.Status, detail: res.Reason}
	}
	return delivery{outcome: refused, status: res.Status, detail: res.Reason}
}

// fcmSender delivers through FCM HTTP v1.
type fcmSender struct{ c *fcm.Client }

func (s *fcmSender) name() string { return ProviderFCM }

// appendFCMMessage writes the HTTP v1 request: data only, no notification
// block (the app renders it), high priority so that it wakes the device.
// Title and body are not forwarded, as in the reference.
func appendFCMMessage(b []byte, msg *sendMessage) []byte {
	b = append(b, `{"message":{"token":`...)
	b = appendJSONString(b, msg.token)
	b = append(b, `,"data":{`...)
	for i, e := range msg.data {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, e.key)
		b = append(b, ':')
		b = appendJSONString(b, e.val)
	}
	return append(b, `},"android":{"priority":"HIGH"}}}`...)
}

func (s *fcmSender) send(ctx context.Context, msg *sendMessage, buf []byte) delivery {
	// Title and body are not forwarded: only data values are clipped.
	clipped := fit(msg, fcmMaxData, fcmDataLen, skipNone, false)
	res, err := s.c.Send(ctx, bytes.Clone(appendFCMMessage(buf[:0], msg)))
	d := fcmDelivery(res, err)
	d.clipped = clipped
	return d
}

func fcmDelivery(res fcm.Result, err error) delivery {
	if err != nil {
		return sendError(err)
	}
	switch {
	case res.Status >= 200 && res.Status < 300:
		return delivery{outcome: delivered, status: res.Status}
	case res.Unregistered:
		// 404 with an FcmError UNREGISTERED, and nothing else.
		return delivery{outcome: stale, status: res.Status, detail: res.ErrorCode}
	}
	detail := res.ErrorCode
	if res.Message != "" {
		detail += ": " + res.Message
	}
	return delivery{outcome: refused, status: res.Status, detail: detail}
}

// sendError classifies an error from a provider module: no answer was
// read. The text of a *url.Error names the request URL, which holds the
// APNs device token, so only its cause is kept for the log.
func sendError(err error) delivery {
	d := delivery{outcome: errored, notSent: errors.Is(err, push.ErrNotSent)}
	var ue *url.Error
	if errors.As(err, &ue) {
		d.detail = ue.Op + ": " + ue.Err.Error()
	} else {
		d.detail = err.Error()
	}
	if d.notSent {
		d.detail = "not sent: " + d.detail
	}
	return d
}

// clipDetail bounds provider text for the log.
func clipDetail(s string) string {
	if len(s) <= maxLogDetail {
		return s
	}
	// Cut on a rune boundary.
	b := clip16([]byte(s), maxLogDetail)
	return string(b)
}

// statusText is the status for logs ("410"), "" when there was none.
func statusText(status int) string {
	if status == 0 {
		return ""
	}
	return strconv.Itoa(status)
}
