package mailboxjs

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"edgerelay/store/cluster"
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
	if !ok || !cluster.SubjectToken(app) || !cluster.SubjectToken(id) {
		return names{}, fmt.Errorf("mailboxjs: mailbox name %q is not <app>/<id>", name)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	k := int(h.Sum32() % uint32(s.shards))
	return names{shard: k, stream: streamName(k), base: fmt.Sprintf("mbx.%d.%s.%s", k, app, id), app: app, id: id}, nil
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

// Caps on the head's sets: they are rewritten with every write, so they
// must stay small. Each set is written as a list or as a bitmap, whichever
// is shorter, so writes that race or pipeline (8 writers on one direction
// leave hundreds of holes and write most envelopes below the max) fit as
// long as the direction does: 4,096 sequences in a span of 8,192 are at
// most 1 KiB either way. A write that adds a run or an out-of-order entry
// past a byte cap is answered full (507) until the reader prunes; only
// sequences spread widely (gaps of thousands) get there. The counts bound
// what a decoder accepts.
const (
	maxRuns            = 4096
	maxRunsBytes       = 1024
	maxOutOfOrder      = 4096
	maxOutOfOrderBytes = 1024
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
	b = appendRuns(b, h.Stored)
	b = appendOutOfOrder(b, h.OutOfOrder)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Set encodings: a count and then either ascending deltas, or the first
// sequence and a bitmap of the ones after it.
const (
	setList   = 0
	setBitmap = 1
	oooList   = setList
	oooBitmap = setBitmap
)

// bitmapSize is the encoded size of a bitmap from first to last (huge when
// the span is: never chosen).
func bitmapSize(first, last uint64, lenPrefix bool) int {
	span := last - first
	if span/8 >= 1<<20 {
		return 1 << 30
	}
	var tmp [binary.MaxVarintLen64]byte
	n := int(span/8 + 1)
	size := binary.PutUvarint(tmp[:], first) + n
	if lenPrefix {
		size += binary.PutUvarint(tmp[:], uint64(n))
	}
	return size
}

// runsSizes are the encoded sizes of runs as a list and as a bitmap.
func runsSizes(runs []Run) (list, bitmap int) {
	if len(runs) == 0 {
		return 0, 0
	}
	var tmp [binary.MaxVarintLen64]byte
	var prev uint64
	for _, r := range runs {
		list += binary.PutUvarint(tmp[:], r.From-prev) + binary.PutUvarint(tmp[:], r.To-r.From)
		prev = r.To
	}
	return list, bitmapSize(runs[0].From, runs[len(runs)-1].To, true)
}

func runsEncodedSize(runs []Run) int {
	l, bm := runsSizes(runs)
	return min(l, bm)
}

func appendRuns(b []byte, runs []Run) []byte {
	b = binary.AppendUvarint(b, uint64(len(runs)))
	if len(runs) == 0 {
		return b
	}
	list, bitmap := runsSizes(runs)
	if list <= bitmap {
		b = append(b, setList)
		var prev uint64
		for _, r := range runs {
			b = binary.AppendUvarint(b, r.From-prev)
			b = binary.AppendUvarint(b, r.To-r.From)
			prev = r.To
		}
		return b
	}
	first := runs[0].From
	bm := make([]byte, (runs[len(runs)-1].To-first)/8+1)
	for _, r := range runs {
		for s := r.From; s <= r.To; s++ {
			d := s - first
			bm[d/8] |= 1 << (d % 8)
		}
	}
	b = append(b, setBitmap)
	b = binary.AppendUvarint(b, first)
	b = binary.AppendUvarint(b, uint64(len(bm)))
	return append(b, bm...)
}

// runsOfBitmap turns a bitmap of sequences from first into runs.
func runsOfBitmap(first uint64, bm []byte) []Run {
	var runs []Run
	for i, byt := range bm {
		for bit := range 8 {
			if byt&(1<<bit) == 0 {
				continue
			}
			s := first + uint64(i*8+bit)
			if n := len(runs); n > 0 && runs[n-1].To+1 == s {
				runs[n-1].To = s
			} else {
				runs = append(runs, Run{s, s})
			}
		}
	}
	return runs
}

// oooSizes are the encoded sizes of set as a delta list and as a bitmap.
func oooSizes(set []uint64) (list, bitmap int) {
	if len(set) == 0 {
		return 0, 0
	}
	var prev uint64
	var tmp [binary.MaxVarintLen64]byte
	for _, s := range set {
		list += binary.PutUvarint(tmp[:], s-prev)
		prev = s
	}
	return list, bitmapSize(set[0], set[len(set)-1], false)
}

// oooEncodedSize is the shorter of the two.
func oooEncodedSize(set []uint64) int {
	l, bm := oooSizes(set)
	return min(l, bm)
}

func appendOutOfOrder(b []byte, set []uint64) []byte {
	b = binary.AppendUvarint(b, uint64(len(set)))
	if len(set) == 0 {
		return b
	}
	list, bitmap := oooSizes(set)
	if list <= bitmap {
		b = append(b, oooList)
		var prev uint64
		for _, s := range set {
			b = binary.AppendUvarint(b, s-prev)
			prev = s
		}
		return b
	}
	b = append(b, oooBitmap)
	b = binary.AppendUvarint(b, set[0])
	bm := make([]byte, (set[len(set)-1]-set[0])/8+1)
	for _, s := range set {
		d := s - set[0]
		bm[d/8] |= 1 << (d % 8)
	}
	return append(b, bm...)
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
	if nr > maxRuns+1 || bad {
		return Head{}, errBadHead
	}
	var prev uint64
	if nr > 0 {
		if len(b) == 0 {
			return Head{}, errBadHead
		}
		mode := b[0]
		b = b[1:]
		switch mode {
		case setList:
			for range nr {
				from := prev + u()
				to := from + u()
				h.Stored = append(h.Stored, Run{from, to})
				prev = to
			}
		case setBitmap:
			first, n := u(), int(u())
			if bad || n > len(b) || n > maxRunsBytes+1 {
				return Head{}, errBadHead
			}
			h.Stored = runsOfBitmap(first, b[:n])
			b = b[n:]
			if uint64(len(h.Stored)) != nr {
				return Head{}, errBadHead
			}
		default:
			return Head{}, errBadHead
		}
	}
	no := u()
	if no > maxOutOfOrder+1 || bad {
		return Head{}, errBadHead
	}
	if no > 0 {
		if len(b) == 0 {
			return Head{}, errBadHead
		}
		mode := b[0]
		b = b[1:]
		switch mode {
		case oooList:
			prev = 0
			for range no {
				prev += u()
				h.OutOfOrder = append(h.OutOfOrder, prev)
			}
		case oooBitmap:
			first := u()
			if bad || len(b) > maxOutOfOrderBytes+1 {
				return Head{}, errBadHead
			}
			for i, byt := range b {
				for bit := range 8 {
					if byt&(1<<bit) != 0 {
						h.OutOfOrder = append(h.OutOfOrder, first+uint64(i*8+bit))
					}
				}
			}
			b = nil
			if uint64(len(h.OutOfOrder)) != no {
				return Head{}, errBadHead
			}
		default:
			return Head{}, errBadHead
		}
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
