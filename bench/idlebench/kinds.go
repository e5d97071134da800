package idlebench

import (
	"crypto/sha256"
	"fmt"

	"edgerelay/bench/relayserve"
	"edgerelay/fastpath/channel"
	"edgerelay/store"
)

// Kind is one of the four long-lived sockets a relay holds for its users,
// mostly idle.
type Kind string

const (
	// Watch is a device's mailbox watch socket (GET …/<dir>/watch).
	Watch Kind = "watch"
	// Signal is one side of a mailbox's signal rendezvous (GET
	// …/signal/<primary|companion>), both sides connected.
	Signal Kind = "signal"
	// Phone is a phone's private channel (GET /botharness-device/channel),
	// on a computer whose control socket is open.
	Phone Kind = "phone"
	// Control is a computer's control socket (GET /host).
	Control Kind = "control"
)

// The connections of the accept path, before any upgrade: what a flood
// of idle connections costs.
const (
	// Silent is a connection that has sent nothing yet (over TLS: its
	// handshake done, no request).
	Silent Kind = "silent"
	// KeepAlive is a plain-HTTP keep-alive connection idle after one
	// request (GET /health) was answered.
	KeepAlive Kind = "keepalive"
)

// Kinds are the four WebSockets, in the report's order; AcceptKinds the
// connections that never upgrade.
var (
	Kinds       = []Kind{Watch, Signal, Phone, Control}
	AcceptKinds = []Kind{Silent, KeepAlive}
)

// ParseKind reads a kind's name.
func ParseKind(s string) (Kind, error) {
	for _, k := range append(Kinds[:len(Kinds):len(Kinds)], AcceptKinds...) {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("idlebench: kind %q: want watch, signal, phone, control, silent or keepalive", s)
}

// onChannel reports whether the kind's sockets are the channel listener's
// (the others are the mailbox listener's).
func (k Kind) onChannel() bool { return k == Phone || k == Control || k == KeepAlive }

// upgrades reports whether the kind's connections are WebSockets.
func (k Kind) upgrades() bool { return k != Silent && k != KeepAlive }

// Layout is how n sockets of a kind spread over mailboxes and computers.
type Layout struct {
	Kind    Kind
	Sockets int
	// PerDirection is how many watch sockets share a direction of a
	// mailbox (1 to 8, the spec's cap; watch only).
	PerDirection int
	// PerComputer is how many phones share a computer (1 to 32; phone
	// only).
	PerComputer int
}

// DefaultLayout packs n sockets of kind as tightly as the protocols allow:
// 8 watches per direction, 32 phones per computer.
func DefaultLayout(kind Kind, n int) Layout {
	return Layout{Kind: kind, Sockets: n, PerDirection: 8, PerComputer: channel.MaxPhones}
}

func (l Layout) check() error {
	switch {
	case l.Sockets < 1:
		return fmt.Errorf("idlebench: %d sockets", l.Sockets)
	case l.Kind == Watch && (l.PerDirection < 1 || l.PerDirection > 8):
		return fmt.Errorf("idlebench: %d watch sockets per direction: the spec allows 1 to 8", l.PerDirection)
	case l.Kind == Phone && (l.PerComputer < 1 || l.PerComputer > channel.MaxPhones):
		return fmt.Errorf("idlebench: %d phones per computer: the protocol allows 1 to %d", l.PerComputer, channel.MaxPhones)
	}
	_, err := ParseKind(string(l.Kind))
	return err
}

// Mailboxes is how many mailboxes the sockets need claimed.
func (l Layout) Mailboxes() int {
	switch l.Kind {
	case Watch:
		return ceilDiv(l.Sockets, 2*l.PerDirection)
	case Signal:
		return ceilDiv(l.Sockets, 2)
	}
	return 0
}

// Computers is how many computers the sockets need claimed: one per
// control socket, or one per PerComputer phones (whose control sockets
// are opened first, see Controls).
func (l Layout) Computers() int {
	switch l.Kind {
	case Control:
		return l.Sockets
	case Phone:
		return ceilDiv(l.Sockets, l.PerComputer)
	}
	return 0
}

// Controls is how many control sockets must be open before the phones:
// the phones' computers.
func (l Layout) Controls() int {
	if l.Kind == Phone {
		return l.Computers()
	}
	return 0
}

// request is socket i's path and header lines.
func (l Layout) request(i int) (path string, header []string) {
	switch l.Kind {
	case Watch:
		dir := [2]string{"p2c", "c2p"}[(i/l.PerDirection)%2]
		return relayserve.MailboxPath(i/(2*l.PerDirection)) + "/" + dir + "/watch",
			[]string{"Sec-WebSocket-Protocol: zerobyte.v1", "Authorization: Bearer " + relayserve.Token}
	case Signal:
		side := [2]string{"primary", "companion"}[i%2]
		return relayserve.MailboxPath(i/2) + "/signal/" + side,
			[]string{"Sec-WebSocket-Protocol: zerobyte.v1", "Authorization: Bearer " + relayserve.Token}
	case Phone:
		return "/botharness-device/channel", []string{"Authorization: Bearer " + PhoneToken(i/l.PerComputer)}
	default:
		return controlRequest(i)
	}
}

func controlRequest(i int) (string, []string) {
	return "/host", []string{"Authorization: Bearer " + OwnerToken(i)}
}

// OwnerToken and PhoneToken are computer i's tokens: 64 characters like
// the hex tokens computers make.
func OwnerToken(i int) string { return fmt.Sprintf("owner%059d", i) }
func PhoneToken(i int) string { return fmt.Sprintf("phone%059d", i) }

func hashOf(s string) store.Hash { return sha256.Sum256([]byte(s)) }

func ceilDiv(a, b int) int { return (a + b - 1) / b }
