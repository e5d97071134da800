package channelbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"edgerelay/bench/channelload"
	"edgerelay/bench/serverproc"
	"edgerelay/fastpath/channel"
)

// IdleOptions shape CompareIdle. Zero fields take the defaults noted.
type IdleOptions struct {
	// Binary is cmd/channelserve (see BuildChannelserve). Required.
	Binary string
	// Phones is how many idle phone channels each relay holds. Default
	// 10,000.
	Phones int
	// PerComputer is how many of them share one computer's control
	// socket: at most 32, the protocol's cap. Default 32, so 313
	// computers hold 10,000 phones.
	PerComputer int
	// Rounds is how many relays of each kind are measured, alternately;
	// each is a fresh process, so none is a warm-up. Default 1.
	Rounds int
	// DataDir holds our relay's stores; a temporary directory when empty.
	DataDir string
	// ProfileDir, when set, receives a heap profile of each relay with
	// its phones open (channelserve-idle-<relay>-<round>.pprof).
	ProfileDir string
	// Progress, when not nil, gets one line per relay.
	Progress io.Writer
}

func (o IdleOptions) withDefaults() (IdleOptions, error) {
	if o.Phones == 0 {
		o.Phones = 10_000
	}
	if o.PerComputer == 0 {
		o.PerComputer = channel.MaxPhones
	}
	if o.Rounds == 0 {
		o.Rounds = 1
	}
	switch {
	case o.Binary == "":
		return o, errors.New("channelbench: IdleOptions.Binary is required (see BuildChannelserve)")
	case o.Phones < 1 || o.Rounds < 1:
		return o, errors.New("channelbench: Phones and Rounds must be positive")
	case o.PerComputer < 1 || o.PerComputer > channel.MaxPhones:
		return o, fmt.Errorf("channelbench: %d phones per computer: the protocol allows 1 to %d", o.PerComputer, channel.MaxPhones)
	}
	return o, nil
}

// IdleCost is what a relay's idle phone channels cost it (serverproc's
// measurement, per phone).
type IdleCost = serverproc.IdleCost

// IdleReport is the outcome of CompareIdle: the costs of each round's
// relays per phone channel, their medians and ratio.
type IdleReport struct {
	Options   IdleOptions // defaults filled in
	Computers int         // control sockets open under the phones
	serverproc.IdleComparison
}

// CompareIdle measures what an idle phone channel costs our relay and the
// baseline. For each, a channelserve process starts (not pinned: nothing
// is timed); the benchmark claims the computers over HTTP and opens their
// control sockets, reads the relay's memory, opens o.Phones phone
// channels (raw TCP: an upgrade request, the 101, then silence), waits
// until the relay holds them all, and reads its memory again. Each
// phone's share is the difference divided by the phones: the computers'
// sockets are in both readings, so what a phone adds to its computer's
// state (its entry, the open message queued to the computer) is counted
// and the control sockets themselves are not.
//
// The relays ping every socket only once an hour here, so no ping is
// answered or missed while they are measured.
func CompareIdle(ctx context.Context, o IdleOptions) (IdleReport, error) {
	o, err := o.withDefaults()
	if err != nil {
		return IdleReport{}, err
	}
	computers := (o.Phones + o.PerComputer - 1) / o.PerComputer
	if err := serverproc.EnsureFiles(o.Phones+computers, 256); err != nil {
		return IdleReport{}, fmt.Errorf("channelbench: %w", err)
	}
	dataDir := o.DataDir
	if dataDir == "" {
		d, err := os.MkdirTemp("", "channelbench-idle-")
		if err != nil {
			return IdleReport{}, fmt.Errorf("channelbench: %w", err)
		}
		defer os.RemoveAll(d)
		dataDir = d
	}
	c, err := serverproc.CompareIdle(o.Rounds, "idle phone channels", o.Progress, func(side, round int) (IdleCost, error) {
		return measureIdle(ctx, serverproc.Sides[side], round, computers, dataDir, o)
	})
	if err != nil {
		return IdleReport{}, fmt.Errorf("channelbench: %w", err)
	}
	return IdleReport{Options: o, Computers: computers, IdleComparison: c}, nil
}

// computerTokens are one claimed computer's owner and phone tokens.
type computerTokens struct{ owner, phone string }

func measureIdle(ctx context.Context, name string, round, computers int, dataDir string, o IdleOptions) (cost serverproc.IdleCost, err error) {
	p, err := startServe(ctx, o.Binary, name, dataDir, -1)
	if err != nil {
		return cost, err
	}
	defer func() { err = errors.Join(err, p.Stop()) }()
	addr := strings.TrimPrefix(p.Ready, "http://")
	tokens := make([]computerTokens, computers)
	for i := range tokens {
		key, err := p.Ask(ctx, "key", 30*time.Second)
		if err != nil {
			return cost, err
		}
		tokens[i] = computerTokens{owner: channelload.NewToken(), phone: channelload.NewToken()}
		if err := channelload.Claim(ctx, channelload.Options{Origin: p.Ready, ClaimKey: key}, tokens[i].owner, tokens[i].phone); err != nil {
			return cost, err
		}
	}
	ctrls, err := serverproc.OpenAll(ctx, computers, func(i int) (net.Conn, error) {
		return serverproc.DialUpgrade(addr, "/host", "Authorization: Bearer "+tokens[i].owner)
	})
	defer func() {
		for _, c := range ctrls {
			_ = c.Close()
		}
	}()
	if err != nil {
		return cost, err
	}
	// MeasureIdle counts the phones from what the relay holds before
	// them: the control sockets, all of them.
	if err := p.WaitCount(ctx, computers); err != nil {
		return cost, err
	}
	profile := ""
	if o.ProfileDir != "" {
		profile = filepath.Join(o.ProfileDir, fmt.Sprintf("channelserve-idle-%s-%d.pprof", name, round))
	}
	return serverproc.MeasureIdle(ctx, p, o.Phones, func(ctx context.Context) ([]net.Conn, error) {
		return serverproc.OpenAll(ctx, o.Phones, func(i int) (net.Conn, error) {
			return serverproc.DialUpgrade(addr, "/botharness-device/channel", "Authorization: Bearer "+tokens[i/o.PerComputer].phone)
		})
	}, profile)
}
