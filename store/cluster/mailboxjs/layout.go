package mailboxjs

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
)

// Header names of the layout. Nats-* are the server's; Er-* are ours and
// travel with RePublish to watchers.
const (
	hdrHead = "Er-Head" // the direction's head after this message (base64url of encodeHead)
	// hdrExpSeq is the compare-and-set: the stream sequence of the
	// direction's previous message. The server keeps it with the message
	// and RePublish passes it on, so it is also the link a watcher
	// checks its chain with.
	hdrExpSeq   = "Nats-Expected-Last-Subject-Sequence"
	hdrExpSubj  = "Nats-Expected-Last-Subject-Sequence-Subject"
	hdrRollup   = "Nats-Rollup"
	hdrStreamSq = "Nats-Sequence"
)

// Names of one mailbox in shard k ("<app>/<id>" split at its '/'; both
// parts are subject-safe by the spec's alphabets, so no client byte beyond
// them reaches a subject):
//
//	mbx.<k>.<app>.<id>.c             claim: token hash (32) | last active (8), rollup
//	mbx.<k>.<app>.<id>.<dir>.e       in-order envelopes (client seq above every earlier one)
//	mbx.<k>.<app>.<id>.<dir>.o.<seq> an envelope written below the direction's max (rare)
//	mbx.<k>.<app>.<id>.<dir>.m       prune mark message (no body), rollup
//	mbx.<k>.<app>.<id>.r<dir>        sealed push registration, rollup
//
// dir is p2c or c2p. The head of a direction is the Er-Head of the last
// message under mbx.<k>.<app>.<id>.<dir>.> and its revision is that
// message's stream sequence: every message there is written with a
// compare-and-set on it (Nats-Expected-Last-Subject-Sequence with
// -Subject set to the wildcard), so each message names its predecessor
// exactly. An envelope's client sequence is its own bytes 1..8 (the
// relay checked them against the URL), so it needs no header.
type names struct {
	shard  int
	stream string
	base   string // mbx.<k>.<app>.<id>
	app    string
	id     string
}

func (s *Store) names(name string) (names, error) {
	app, id, ok := strings.Cut(name, "/")
	if !ok || !validToken(app) || !validToken(id) {
		return names{}, fmt.Errorf("mailboxjs: mailbox name %q is not <app>/<id>", name)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	k := int(h.Sum32() % uint32(s.shards))
	return names{shard: k, stream: streamName(k), base: fmt.Sprintf("mbx.%d.%s.%s", k, app, id), app: app, id: id}, nil
}

// validToken accepts the union of the app (a-z 0-9 -) and mailbox id
// (A-Z a-z 0-9 _ -) alphabets: nothing that could end or widen a subject.
func validToken(t string) bool {
	if t == "" || len(t) > 64 {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func streamName(k int) string { return fmt.Sprintf("ER_MBX_%d", k) }

func dirToken(dir byte) string {
	if dir == 'p' {
		return "p2c"
	}
	return "c2p"
}

func (n names) claim() string           { return n.base + ".c" }
func (n names) dirAll(dir byte) string  { return n.base + "." + dirToken(dir) + ".>" }
func (n names) inOrder(dir byte) string { return n.base + "." + dirToken(dir) + ".e" }
func (n names) mark(dir byte) string    { return n.base + "." + dirToken(dir) + ".m" }
func (n names) push(dir byte) string    { return n.base + ".r" + dirToken(dir) }
func (n names) watch(dir byte) string {
	return "er.w." + n.app + "." + n.id + "." + dirToken(dir) + ".>"
}
func (n names) control() string { return "er.mbx." + n.app + "." + n.id + ".ctl" }
func (n names) ooo(dir byte, seq uint64) string {
	return fmt.Sprintf("%s.%s.o.%d", n.base, dirToken(dir), seq)
}

// Head is one direction's state, carried in the header of the direction's
// last message. Stored is the set of stored client sequences as sorted,
// disjoint, inclusive runs: normally one run, more only while a writer
// fills holes. OutOfOrder lists the stored sequences that were written
// below the max of their time (they live on their own .o.<seq> subject, so
// that the .e subject is ascending in client sequence and can be
// binary-searched).
type Head struct {
	Rev         uint64 // stream sequence of the message carrying this head (0: none)
	Max         uint64 // highest sequence ever stored since the last erase
	Count       int
	Bytes       int
	Pruned      uint64
	EnvTAT      int64  // GCRA theoretical arrival time of the envelope bucket (unix ns)
	PushTAT     int64  // same, of the push bucket
	Active      int64  // unix ns of the last write
	FirstStream uint64 // no in-order envelope kept has a stream sequence below this
	// CumInOrder is the bytes of every in-order envelope ever written since
	// the last erase (so each in-order envelope's head holds the running
	// total through itself). PrunedCum is the part of it that prunes removed: a prune learns the
	// bytes it frees from the first envelope it keeps, without reading the
	// ones it drops.
	CumInOrder, PrunedCum uint64
	Stored                []Run
	OutOfOrder            []uint64 // ascending
}

// Run is the inclusive range [From, To] of stored sequences.
type Run struct{ From, To uint64 }

// Caps on the head's lists: they are rewritten with every write, so they
// must stay small. A write that would pass one is answered full (507)
// until the reader prunes: it takes a writer leaving that many holes, or
// that many writes below the max, to get there.
const (
	maxRuns       = 256
	maxOutOfOrder = 256
)

// First is the lowest stored sequence (0 when empty); Last the highest.
func (h *Head) First() uint64 {
	if len(h.Stored) == 0 {
		return 0
	}
	return h.Stored[0].From
}

func (h *Head) Last() uint64 {
	if len(h.Stored) == 0 {
		return 0
	}
	return h.Stored[len(h.Stored)-1].To
}

// Has reports whether seq is stored.
func (h *Head) Has(seq uint64) bool {
	_, found := slices.BinarySearchFunc(h.Stored, seq, func(r Run, s uint64) int {
		switch {
		case r.To < s:
			return -1
		case r.From > s:
			return 1
		}
		return 0
	})
	return found
}

func (h *Head) isOutOfOrder(seq uint64) bool {
	_, ok := slices.BinarySearch(h.OutOfOrder, seq)
	return ok
}

// add records seq as stored (not stored yet).
func (h *Head) add(seq uint64, size int) {
	h.Count++
	h.Bytes += size
	if seq < h.Max {
		i, _ := slices.BinarySearch(h.OutOfOrder, seq)
		h.OutOfOrder = slices.Insert(h.OutOfOrder, i, seq)
	}
	h.Max = max(h.Max, seq)
	i, _ := slices.BinarySearchFunc(h.Stored, seq, func(r Run, s uint64) int {
		if r.To < s {
			return -1
		}
		return 1
	})
	// i is the first run ending at or above seq (so starting above it).
	joinLeft := i > 0 && h.Stored[i-1].To+1 == seq
	joinRight := i < len(h.Stored) && h.Stored[i].From == seq+1
	switch {
	case joinLeft && joinRight:
		h.Stored[i-1].To = h.Stored[i].To
		h.Stored = slices.Delete(h.Stored, i, i+1)
	case joinLeft:
		h.Stored[i-1].To = seq
	case joinRight:
		h.Stored[i].From = seq
	default:
		h.Stored = slices.Insert(h.Stored, i, Run{seq, seq})
	}
}

// pruneThrough drops every run and out-of-order entry at or below through.
func (h *Head) pruneThrough(through uint64) {
	h.Pruned = max(h.Pruned, through)
	for len(h.Stored) > 0 && h.Stored[0].To <= through {
		h.Stored = h.Stored[1:]
	}
	if len(h.Stored) > 0 && h.Stored[0].From <= through {
		h.Stored[0].From = through + 1
	}
	i, _ := slices.BinarySearch(h.OutOfOrder, through+1)
	h.OutOfOrder = h.OutOfOrder[i:]
	if len(h.Stored) == 0 {
		h.Stored, h.OutOfOrder = nil, nil
	}
}

// encodeHead is the head in the Er-Head header: varints, base64url.
func encodeHead(h *Head) string {
	b := make([]byte, 0, 64+8*len(h.Stored)+4*len(h.OutOfOrder))
	b = append(b, 1) // version
	b = binary.AppendUvarint(b, h.Max)
	b = binary.AppendUvarint(b, uint64(h.Count))
	b = binary.AppendUvarint(b, uint64(h.Bytes))
	b = binary.AppendUvarint(b, h.Pruned)
	b = binary.AppendVarint(b, h.EnvTAT)
	b = binary.AppendVarint(b, h.PushTAT)
	b = binary.AppendVarint(b, h.Active)
	b = binary.AppendUvarint(b, h.FirstStream)
	b = binary.AppendUvarint(b, h.CumInOrder)
	b = binary.AppendUvarint(b, h.PrunedCum)
	b = binary.AppendUvarint(b, uint64(len(h.Stored)))
	var prev uint64
	for _, r := range h.Stored {
		b = binary.AppendUvarint(b, r.From-prev)
		b = binary.AppendUvarint(b, r.To-r.From)
		prev = r.To
	}
	b = binary.AppendUvarint(b, uint64(len(h.OutOfOrder)))
	prev = 0
	for _, s := range h.OutOfOrder {
		b = binary.AppendUvarint(b, s-prev)
		prev = s
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

var errBadHead = errors.New("mailboxjs: malformed head")

func decodeHead(s string, rev uint64) (Head, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) == 0 || b[0] != 1 {
		return Head{}, errBadHead
	}
	b = b[1:]
	var bad bool
	u := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			bad = true
			return 0
		}
		b = b[n:]
		return v
	}
	i := func() int64 {
		v, n := binary.Varint(b)
		if n <= 0 {
			bad = true
			return 0
		}
		b = b[n:]
		return v
	}
	h := Head{Rev: rev}
	h.Max, h.Count, h.Bytes, h.Pruned = u(), int(u()), int(u()), u()
	h.EnvTAT, h.PushTAT, h.Active = i(), i(), i()
	h.FirstStream = u()
	h.CumInOrder, h.PrunedCum = u(), u()
	nr := u()
	if nr > maxRuns+1 {
		return Head{}, errBadHead
	}
	var prev uint64
	for range nr {
		from := prev + u()
		to := from + u()
		h.Stored = append(h.Stored, Run{from, to})
		prev = to
	}
	no := u()
	if no > maxOutOfOrder+1 {
		return Head{}, errBadHead
	}
	prev = 0
	for range no {
		prev += u()
		h.OutOfOrder = append(h.OutOfOrder, prev)
	}
	if bad || len(b) != 0 {
		return Head{}, errBadHead
	}
	return h, nil
}

// gcra takes one token from a bucket of burst tokens refilled one per
// every, kept as its theoretical arrival time: it returns the new time, or
// ok false and how long until a token is there.
func gcra(tat, now int64, burst int, every int64) (next int64, ok bool, wait int64) {
	if burst <= 0 || every <= 0 {
		return tat, true, 0
	}
	tat = max(tat, now)
	if tat-now > int64(burst-1)*every {
		return tat, false, tat - now - int64(burst-1)*every
	}
	return tat + every, true, 0
}
