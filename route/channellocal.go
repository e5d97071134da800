package route

import (
	"context"
	"sync"

	"edgerelay/fastpath/channel/control"
	"edgerelay/store"
)

// LocalChannel routes the private channel inside this process: the
// computers whose control socket is open here, each with its phones. A
// phone's frame is wrapped and queued onto the control socket by the
// phone's reader, a computer's frame queued onto the phone by the control
// socket's reader: no lock is held across a write, nothing allocates per
// frame. The cluster's router (store/cluster/channelroute) keeps one for
// this node's sockets and puts phones of other nodes in it as sinks that
// publish.
type LocalChannel struct {
	// mu guards computers, the computers whose control socket is open
	// (or being opened) here. Held only to look up, add or remove.
	mu        sync.Mutex
	computers map[store.Hash]*localComputer

	// scratch pools the buffers phone frames are wrapped into.
	scratch sync.Pool
}

// NewLocalChannel returns an empty router.
func NewLocalChannel() *LocalChannel {
	l := &LocalChannel{computers: make(map[store.Hash]*localComputer)}
	l.scratch.New = func() any { b := make([]byte, 0, 2048); return &b }
	return l
}

// maxPooledWrap: even a frame at the limit, escaped, fits a pooled
// buffer, so wrapping stays allocation-free up to 70,000 bytes.
const maxPooledWrap = 6*control.MaxData + 4096

// localComputer is one computer whose control socket is open or being
// opened here. Its entry in LocalChannel.computers is the reservation that
// refuses a second control socket.
type localComputer struct {
	l   *LocalChannel
	key store.Hash

	// ready is closed once ctl is set or the computer is gone. The 101
	// reaches the computer before the relay's side of the socket exists,
	// so a phone admitted in that instant waits for ready instead of
	// being refused.
	ready     chan struct{}
	readyOnce sync.Once

	mu       sync.Mutex
	ctl      ChannelSink                       // nil until attached
	phones   map[control.ID]*LocalChannelPhone // made at the first phone: most computers idle without one
	reserved int                               // phones admitted but not yet attached
	gone     bool                              // the control socket has ended
}

// LocalChannelPhone is one phone channel of a computer hosted here; its
// socket is local, or (in a cluster) a sink that publishes to its node.
type LocalChannelPhone struct {
	comp *localComputer
	id   control.ID

	// mu guards the fields below (comp.mu is taken before it, never after).
	mu       sync.Mutex
	conn     ChannelSink
	ctl      ChannelSink // the computer's, set at Attach
	attached bool
	ended    bool
	// closedByComputer is set when the computer's own close message
	// ended the channel: then the computer is not told about it.
	closedByComputer bool
}

func (c *localComputer) markReady() { c.readyOnce.Do(func() { close(c.ready) }) }

// Host implements Channel.
func (l *LocalChannel) Host(_ context.Context, key store.Hash) (ChannelHost, error) {
	comp := &localComputer{l: l, key: key, ready: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.computers[key] != nil {
		return nil, ErrChannelHeld
	}
	l.computers[key] = comp
	return comp, nil
}

// Hosts reports whether the computer's control socket is open (or being
// opened) here.
func (l *LocalChannel) Hosts(key store.Hash) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.computers[key] != nil
}

// Connected implements Channel: the control socket is open here.
func (l *LocalChannel) Connected(_ context.Context, key store.Hash) (bool, error) {
	l.mu.Lock()
	c := l.computers[key]
	l.mu.Unlock()
	if c == nil {
		return false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctl != nil && !c.gone, nil
}

// Shutdown implements Channel.
func (l *LocalChannel) Shutdown(key store.Hash, code int) {
	l.mu.Lock()
	c := l.computers[key]
	l.mu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	ctl := c.ctl
	c.gone = true
	c.mu.Unlock()
	c.markReady()
	if ctl != nil {
		ctl.Close(code, "")
	}
}

// Phone implements Channel.
func (l *LocalChannel) Phone(_ context.Context, key store.Hash, id control.ID) (ChannelPhone, error) {
	p, err := l.Admit(key, id)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Admit reserves phone channel id on the computer hosted here:
// ErrChannelOffline when it is not (or no longer) hosted here,
// ErrChannelFull at the limit.
func (l *LocalChannel) Admit(key store.Hash, id control.ID) (*LocalChannelPhone, error) {
	l.mu.Lock()
	comp := l.computers[key]
	l.mu.Unlock()
	if comp == nil {
		return nil, ErrChannelOffline
	}
	comp.mu.Lock()
	defer comp.mu.Unlock()
	switch {
	case comp.gone:
		return nil, ErrChannelOffline
	case len(comp.phones)+comp.reserved >= ChannelMaxPhones:
		return nil, ErrChannelFull
	}
	comp.reserved++
	return &LocalChannelPhone{comp: comp, id: id}, nil
}

// Attach implements ChannelHost.
func (c *localComputer) Attach(ctl ChannelSink) bool {
	defer c.markReady()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone { // shut down while the upgrade was in flight
		return false
	}
	c.ctl = ctl
	return true
}

// ToPhone implements ChannelHost.
func (c *localComputer) ToPhone(id *control.ID, data []byte) bool {
	c.mu.Lock()
	p := c.phones[*id]
	c.mu.Unlock()
	if p == nil {
		return false // the phone just left, or the id is not this computer's
	}
	// A full queue drops that phone alone; its reader then tells the
	// computer, and every other phone keeps flowing.
	return p.conn.WriteText(data) == nil
}

// ClosePhone implements ChannelHost.
func (c *localComputer) ClosePhone(id *control.ID) bool {
	c.mu.Lock()
	p := c.phones[*id]
	if p != nil {
		delete(c.phones, *id)
		p.mu.Lock()
		p.closedByComputer = true
		p.mu.Unlock()
	}
	c.mu.Unlock()
	if p == nil {
		return false
	}
	p.conn.Close(1000, "")
	return true
}

// End implements ChannelHost: forgets the computer and closes every phone
// it had with 1001.
func (c *localComputer) End() {
	c.l.mu.Lock()
	if c.l.computers[c.key] == c {
		delete(c.l.computers, c.key)
	}
	c.l.mu.Unlock()
	c.mu.Lock()
	c.gone = true
	c.markReady()
	phones := make([]*LocalChannelPhone, 0, len(c.phones))
	for _, p := range c.phones {
		phones = append(phones, p)
	}
	c.mu.Unlock()
	for _, p := range phones {
		p.conn.Close(1001, "computer offline")
	}
}

// Ready is closed once the computer's control socket is attached or gone:
// after it, Attach does not wait.
func (p *LocalChannelPhone) Ready() <-chan struct{} { return p.comp.ready }

// Attached reports whether the phone's socket was attached.
func (p *LocalChannelPhone) Attached() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attached
}

// Attach implements ChannelPhone.
func (p *LocalChannelPhone) Attach(ctx context.Context, conn ChannelSink) bool {
	comp := p.comp
	select {
	case <-comp.ready:
	case <-ctx.Done():
	}
	comp.mu.Lock()
	p.mu.Lock()
	if p.attached || p.ended {
		p.mu.Unlock()
		comp.mu.Unlock()
		return false
	}
	comp.reserved--
	p.ended = true // until attached below: End gives nothing back twice
	ctl := comp.ctl
	if comp.gone || ctl == nil {
		p.mu.Unlock()
		comp.mu.Unlock()
		return false
	}
	p.ended, p.attached, p.conn, p.ctl = false, true, conn, ctl
	if comp.phones == nil {
		comp.phones = make(map[control.ID]*LocalChannelPhone)
	}
	comp.phones[p.id] = p
	p.mu.Unlock()
	comp.mu.Unlock()
	var buf [16 + control.IDLen + 2]byte
	_ = ctl.WriteText(control.AppendOpen(buf[:0], &p.id))
	return true
}

// ToHost implements ChannelPhone.
func (p *LocalChannelPhone) ToHost(frame []byte) error {
	l := p.comp.l
	bp := l.scratch.Get().(*[]byte)
	*bp = control.AppendData((*bp)[:0], &p.id, frame)
	err := p.ToHostWrapped(*bp)
	// The pool itself lets idle buffers go at GC.
	if cap(*bp) <= maxPooledWrap {
		l.scratch.Put(bp)
	}
	return err
}

// ToHostWrapped writes a data message already wrapped (by the phone's
// node) to the control socket as it is.
func (p *LocalChannelPhone) ToHostWrapped(msg []byte) error {
	if p.ctl == nil { // never attached
		return ErrChannelOffline
	}
	return p.ctl.WriteText(msg)
}

// End implements ChannelPhone.
func (p *LocalChannelPhone) End() {
	comp := p.comp
	comp.mu.Lock()
	p.mu.Lock()
	if p.ended {
		p.mu.Unlock()
		comp.mu.Unlock()
		return
	}
	p.ended = true
	if !p.attached {
		comp.reserved--
		p.mu.Unlock()
		comp.mu.Unlock()
		return
	}
	if comp.phones[p.id] == p {
		delete(comp.phones, p.id)
	}
	tell := !p.closedByComputer && !comp.gone
	ctl := comp.ctl
	p.mu.Unlock()
	comp.mu.Unlock()
	if tell {
		var buf [16 + control.IDLen + 2]byte
		_ = ctl.WriteText(control.AppendClose(buf[:0], &p.id))
	}
}
