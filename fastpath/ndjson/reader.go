package ndjson

import (
	"bytes"
	"errors"
	"io"
)

// MaxLine is the longest line the spec allows, counting its line feed (and
// the carriage return before it, if any): 16 MiB.
const MaxLine = 16 << 20

// DefaultBufSize is the Reader's starting buffer when NewReader is given no
// size: enough for any ordinary frame.
const DefaultBufSize = 64 << 10

// shrinkAfter is how many lines in a row must fit the starting buffer before
// a Reader whose buffer grew for a big line goes back to the starting size.
// Waiting a few lines keeps a peer that mixes big and small lines from
// costing an allocation per big line; not waiting forever keeps an idle
// link from holding 16 MiB because of one line long ago. The instance
// connector sends a heartbeat every 15 s, so an idle link shrinks within
// minutes.
const shrinkAfter = 16

// maxEmptyReads bounds how many reads in a row may return nothing and no
// error before Next gives up with io.ErrNoProgress, as bufio does.
const maxEmptyReads = 100

// Errors returned by Reader.Next.
var (
	// ErrLineTooLong: a line is longer than MaxLine. It is terminal: the
	// stream cannot be resynchronised, so the connection must be closed.
	ErrLineTooLong = errors.New("ndjson: line longer than 16 MiB")
	// ErrTruncated: the stream ended in the middle of a line (a last line
	// without its line feed), which is a truncated frame.
	ErrTruncated = errors.New("ndjson: stream ended inside a line")

	errInvalidRead = errors.New("ndjson: io.Reader returned an invalid count")
)

// Reader cuts a byte stream (an instance link) into lines.
//
// Lines may arrive in chunks of any size. Blank and whitespace-only lines
// (spaces, tabs, carriage returns) are skipped; one carriage return before
// the line feed is stripped. Nothing is allocated per line once the buffer
// has grown to the longest line seen; the buffer goes back to its starting
// size some lines after a big one.
type Reader struct {
	rd      io.Reader
	buf     []byte // len(buf) == cap(buf); buf[start:end] is not returned yet
	start   int
	end     int
	scanned int   // buf[start:start+scanned] holds no line feed
	base    int   // the starting size, which buf shrinks back to
	small   int   // lines in a row, up to shrinkAfter, that fit in base bytes
	err     error // the error that ended reading, returned once lines run out
}

// NewReader returns a Reader of r with a buffer of bufSize bytes to start
// with: DefaultBufSize if bufSize <= 0, at least 16, at most MaxLine. The
// buffer grows (doubling, up to MaxLine) for longer lines.
func NewReader(r io.Reader, bufSize int) *Reader {
	if bufSize <= 0 {
		bufSize = DefaultBufSize
	}
	bufSize = min(max(bufSize, 16), MaxLine)
	return &Reader{rd: r, buf: make([]byte, bufSize), base: bufSize}
}

// Next returns the next line that is not blank, without its line feed and
// without one carriage return before it. The line aliases the Reader's
// buffer and is valid until the next call to Next.
//
// At the end of the stream Next returns io.EOF; if the stream ended inside
// a line that is not blank, it returns ErrTruncated first. A line longer
// than MaxLine (line feed included) is ErrLineTooLong, returned from then
// on: close the connection. Errors of the underlying reader are returned
// once the complete lines before them have been.
func (r *Reader) Next() ([]byte, error) {
	for {
		if r.err == ErrLineTooLong {
			return nil, r.err
		}
		if j := bytes.IndexByte(r.buf[r.start+r.scanned:r.end], '\n'); j >= 0 {
			lf := r.start + r.scanned + j
			line := r.buf[r.start:lf]
			n := lf + 1 - r.start
			r.start, r.scanned = lf+1, 0
			if n > MaxLine { // cannot happen while the buffer holds at most MaxLine bytes
				r.err = ErrLineTooLong
				return nil, r.err
			}
			if n <= r.base {
				r.small = min(r.small+1, shrinkAfter)
			} else {
				r.small = 0
			}
			if len(line) > 0 && line[len(line)-1] == '\r' {
				line = line[:len(line)-1]
			}
			if blank(line) {
				continue
			}
			return line, nil
		}
		r.scanned = r.end - r.start
		if r.scanned >= MaxLine {
			// MaxLine bytes and no line feed yet: with it the line is
			// longer than allowed.
			r.err = ErrLineTooLong
			return nil, r.err
		}
		if r.err != nil {
			rest := r.buf[r.start:r.end]
			r.start, r.end, r.scanned = 0, 0, 0
			if r.err == io.EOF && !blank(rest) {
				return nil, ErrTruncated
			}
			return nil, r.err
		}
		r.fill()
	}
}

// blank reports whether line holds nothing but spaces, tabs and carriage
// returns.
func blank(line []byte) bool {
	for _, c := range line {
		if c != ' ' && c != '\t' && c != '\r' {
			return false
		}
	}
	return true
}

// fill makes room at the end of the buffer, moving, growing or shrinking it,
// and reads into it once (or until a read returns something).
func (r *Reader) fill() {
	pending := r.end - r.start
	switch {
	case len(r.buf) > r.base && r.small >= shrinkAfter && pending < r.base:
		nb := make([]byte, r.base)
		copy(nb, r.buf[r.start:r.end])
		r.buf = nb
		r.start, r.end = 0, pending
	case r.start == r.end:
		r.start, r.end = 0, 0
	case r.end == len(r.buf) && r.start > 0:
		// Moving the unfinished line to the front costs at most its
		// length, once per line.
		copy(r.buf, r.buf[r.start:r.end])
		r.start, r.end = 0, pending
	case r.end == len(r.buf):
		// One unfinished line fills the buffer: double it, up to MaxLine.
		nb := make([]byte, min(2*len(r.buf), MaxLine))
		copy(nb, r.buf[r.start:r.end])
		r.buf = nb
		r.start, r.end = 0, pending
	}
	for range maxEmptyReads {
		n, err := r.rd.Read(r.buf[r.end:])
		if n < 0 || n > len(r.buf)-r.end {
			r.err = errInvalidRead
			return
		}
		r.end += n
		if err != nil {
			r.err = err
			return
		}
		if n > 0 {
			return
		}
	}
	r.err = io.ErrNoProgress
}
