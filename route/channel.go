package route

import (
	"context"
	"errors"

	"edgerelay/fastpath/channel/control"
	"edgerelay/store"
)

// ChannelSink is a socket a router writes to; *ws.Conn is one. WriteText queues
// the frame and returns at once (a full queue closes the socket, with its
// protocol's code), so a router never waits on a slow reader; Close ends
// the socket with code and may be called any number of times.
type ChannelSink interface {
	WriteText(p []byte) error
	Close(code int, reason string)
}

// The private channel's refusals, answered 403 before the upgrade.
var (
	// ErrChannelHeld: another control socket of that computer is open, on this
	// node or any other.
	ErrChannelHeld = errors.New("route: control socket already open")
	// ErrChannelOffline: the computer has no control socket open.
	ErrChannelOffline = errors.New("route: computer not connected")
	// ErrChannelFull: the computer already holds ChannelMaxPhones phone channels.
	ErrChannelFull = errors.New("route: too many phone channels")
)

// ChannelMaxPhones is how many phone channels one computer may hold, counted
// wherever the phones are.
const ChannelMaxPhones = 32

// Channel routes the private channel: each claimed computer (by claim key
// hash) has at most one control socket, and phones reach only their own
// computer. A computer's phone admissions are counted where its control
// socket is, which alone serializes them.
type Channel interface {
	// Host reserves the computer's control socket before the upgrade
	// (ErrChannelHeld when it has one). The handler attaches the socket once
	// upgraded, and ends the reservation in every case.
	Host(ctx context.Context, key store.Hash) (ChannelHost, error)
	// Phone admits phone channel id to the computer before the upgrade
	// (ErrChannelOffline, ErrChannelFull); the reservation counts against the limit
	// until it ends.
	Phone(ctx context.Context, key store.Hash, id control.ID) (ChannelPhone, error)
	// Connected reports whether the computer's control socket is open
	// anywhere.
	Connected(ctx context.Context, key store.Hash) (bool, error)
	// Shutdown closes the computer's control socket with code if it is
	// on this node (or makes a pending one fail to attach); its phones
	// follow with 1001 when the handler ends the host.
	Shutdown(key store.Hash, code int)
}

// ChannelHost is a computer's control socket as the router holds it.
type ChannelHost interface {
	// Attach makes ctl the control socket; false when the computer was
	// shut down meanwhile (the handler closes ctl).
	Attach(ctl ChannelSink) bool
	// ToPhone sends the computer's frame to its phone id; false when it
	// has no such phone (gone, or another computer's).
	ToPhone(id *control.ID, data []byte) bool
	// ClosePhone closes the computer's phone id with 1000 at the
	// computer's own request (the computer is not told); false when it
	// has no such phone.
	ClosePhone(id *control.ID) bool
	// End gives the control socket up: every phone of the computer, on
	// every node, closes with 1001. Idempotent.
	End()
}

// ChannelPhone is one phone channel as the router holds it.
type ChannelPhone interface {
	// Attach makes conn the phone's socket once upgraded, waiting until
	// the computer's control socket is attached, and tells the computer
	// "open"; false when the computer went away (the handler closes conn
	// with 1001).
	Attach(ctx context.Context, conn ChannelSink) bool
	// ToHost sends one phone frame to the computer, wrapped in a data
	// message; an error means the control socket is gone.
	ToHost(frame []byte) error
	// End ends the channel (or gives an unattached reservation back); the
	// computer is told "close" unless it closed the channel itself or is
	// gone. Idempotent.
	End()
}
